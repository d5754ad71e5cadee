"""Fused multi-layer capture for any decoder-only target, with no per-model code.

Hooks on the three decoder layers named by the capture ids (our rule: id ``i`` is the input of decoder
layer ``i``, see :mod:`eagle3_plugin.capture_ids`) copy the residual stream into one preallocated buffer,
``[low | mid | high]`` along the last dim, while the target runs its forward. How a hook reaches the
stream depends on how the layer receives it (an *attach* function): Hugging Face layers get it as
``hidden_states``; engine layers with a fused residual add get it in two parts
(:func:`residual_stream_reader`); SGLang layers hand it to a callback (see ``eagle3_plugin.sglang``).
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .capture_ids import validate_layer_ids

WriteFn = Callable[[torch.Tensor], None]
AttachFn = Callable[[nn.Module, WriteFn], RemovableHandle]


class UnsupportedTarget(RuntimeError):
    """The target's decoder layers do not expose their residual stream in a way we can read safely."""


def decoder_layers(model: nn.Module, num_layers: int | None = None) -> nn.ModuleList:
    """The decoder-layer list of ``model``: the ModuleList with ``num_hidden_layers`` entries.

    Works for Llama, Qwen, Mistral, GPT-2 (``transformer.h``), ... without naming them.
    """
    n = num_layers if num_layers is not None else model.config.num_hidden_layers
    candidates = [m for _, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == n]
    if len(candidates) != 1:
        raise ValueError(f"cannot identify the decoder layers of {type(model).__name__}: "
                         f"{len(candidates)} ModuleLists have num_hidden_layers={n} entries")
    return candidates[0]


def hf_stream(args, kwargs) -> torch.Tensor:
    """Transformers decoder layers receive the residual stream itself as ``hidden_states``."""
    return args[0] if args else kwargs["hidden_states"]


def residual_stream_reader(layer: nn.Module):
    """How to read the residual stream from an engine decoder layer's inputs.

    Layers taking ``(positions, hidden_states, residual)`` with the residual add fused into
    ``input_layernorm`` (vLLM, older SGLang models) carry the stream as ``hidden_states + residual``
    (just ``hidden_states`` at layer 0). Layers without ``residual`` receive the stream itself. A layer
    with a ``residual`` but no fused ``input_layernorm`` (e.g. post-norm designs) is refused.
    """
    params = list(inspect.signature(layer.forward).parameters)
    if "residual" not in params:
        index = params.index("hidden_states")
        return lambda args, kwargs: args[index] if len(args) > index else kwargs["hidden_states"]
    if not hasattr(layer, "input_layernorm"):
        raise UnsupportedTarget(f"{type(layer).__name__} takes a residual but has no fused input_layernorm: "
                                "its residual stream cannot be read safely")
    h, r = params.index("hidden_states"), params.index("residual")

    def stream(args, kwargs):
        hidden = args[h] if len(args) > h else kwargs["hidden_states"]
        residual = args[r] if len(args) > r else kwargs.get("residual")
        return hidden if residual is None else hidden + residual
    return stream


def read_inputs(stream=hf_stream) -> AttachFn:
    """Attach by a forward pre-hook that reads the stream from the layer's inputs with ``stream(args, kwargs)``."""
    def attach(layer: nn.Module, write: WriteFn) -> RemovableHandle:
        return layer.register_forward_pre_hook(lambda module, args, kwargs: write(stream(args, kwargs)),
                                               with_kwargs=True)
    return attach


class FusedCapture:
    """Hooks writing the three captured layers of every forward into one buffer ``[..., 3 * H]``.

    Use as a context manager around target forwards; after each forward, :attr:`features` is a view of
    the buffer for that forward's tokens, valid until the next forward. The buffer grows (rarely) only
    when a forward is larger than any before it. ``attach(layer, write)`` hooks one layer so that
    ``write`` receives the stream entering it (default: Hugging Face layers, :func:`read_inputs`).
    """

    def __init__(self, model: nn.Module, layer_ids, capacity_tokens: int = 4096, layers: nn.ModuleList | None = None,
                 attach: AttachFn | None = None, hidden_size: int | None = None):
        layers = decoder_layers(model) if layers is None else layers
        self.layer_ids = validate_layer_ids(layer_ids, len(layers))
        self.hidden_size = hidden_size or model.config.hidden_size
        self._attach = attach or read_inputs()
        self._layers = [layers[i] for i in self.layer_ids]
        self._buffer = torch.empty(capacity_tokens * 3 * self.hidden_size,
                                   dtype=next(model.parameters()).dtype, device=next(model.parameters()).device)
        self._handles = []
        self.features: torch.Tensor | None = None

    def __enter__(self) -> "FusedCapture":
        for slot, layer in enumerate(self._layers):
            self._handles.append(self._attach(layer, self._writer(slot)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _writer(self, slot: int) -> WriteFn:
        h = self.hidden_size

        def write(hidden: torch.Tensor) -> None:
            if slot == 0:
                self._start(hidden.shape[:-1])
            self.features[..., slot * h:(slot + 1) * h].copy_(hidden)

        return write

    def _start(self, shape: torch.Size) -> None:
        needed = shape.numel() * 3 * self.hidden_size
        if needed > self._buffer.numel():
            self._buffer = torch.empty(needed, dtype=self._buffer.dtype, device=self._buffer.device)
        self.features = self._buffer[:needed].view(*shape, 3 * self.hidden_size)
