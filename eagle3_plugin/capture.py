"""Fused multi-layer capture for any Hugging Face decoder-only target, with no per-model code.

Forward pre-hooks on the three decoder layers named by the capture ids (our rule: id ``i`` is the
input of decoder layer ``i``, see :mod:`eagle3_plugin.layers`) copy the residual stream into one
preallocated buffer, ``[low | mid | high]`` along the last dim, while the target runs its forward.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import validate_layer_ids


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


class FusedCapture:
    """Hooks writing the three captured layers of every forward into one buffer ``[..., 3 * H]``.

    Use as a context manager around target forwards; after each forward, :attr:`features` is a view of
    the buffer for that forward's tokens, valid until the next forward. The buffer grows (rarely) only
    when a forward is larger than any before it. ``stream(args, kwargs)`` reads the residual stream
    from a decoder layer's inputs (engines with fused residual adds pass it in two parts).
    """

    def __init__(self, model: nn.Module, layer_ids, capacity_tokens: int = 4096, layers: nn.ModuleList | None = None,
                 stream=hf_stream, hidden_size: int | None = None):
        layers = decoder_layers(model) if layers is None else layers
        self.layer_ids = validate_layer_ids(layer_ids, len(layers))
        self.hidden_size = hidden_size or model.config.hidden_size
        self._stream = stream
        self._layers = [layers[i] for i in self.layer_ids]
        self._buffer = torch.empty(capacity_tokens * 3 * self.hidden_size,
                                   dtype=next(model.parameters()).dtype, device=next(model.parameters()).device)
        self._handles = []
        self.features: torch.Tensor | None = None

    def __enter__(self) -> "FusedCapture":
        for slot, layer in enumerate(self._layers):
            self._handles.append(layer.register_forward_pre_hook(self._hook(slot), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, slot: int):
        h = self.hidden_size

        def write(module, args, kwargs):
            hidden = self._stream(args, kwargs)
            if slot == 0:
                self._start(hidden.shape[:-1])
            self.features[..., slot * h:(slot + 1) * h].copy_(hidden)

        return write

    def _start(self, shape: torch.Size) -> None:
        needed = shape.numel() * 3 * self.hidden_size
        if needed > self._buffer.numel():
            self._buffer = torch.empty(needed, dtype=self._buffer.dtype, device=self._buffer.device)
        self.features = self._buffer[:needed].view(*shape, 3 * self.hidden_size)
