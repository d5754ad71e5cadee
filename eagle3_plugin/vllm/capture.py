"""EAGLE-3 capture for vLLM targets that do not implement ``SupportsEagle3``.

vLLM feeds EAGLE-3 drafts from ``aux_hidden_states``, which only models implementing ``SupportsEagle3``
produce. For any other decoder, we give the loaded model that interface at run time: the core's
:class:`~eagle3_plugin.capture.FusedCapture` hooks the three decoder layers into one buffer, and the
model's forward returns ``(hidden_states, [low, mid, high])`` as the runner expects.

Capture ids follow our rule, which is also vLLM's: id ``i`` is the residual stream entering layer ``i``.
vLLM decoder layers take ``(positions, hidden_states, residual)`` with the residual add fused into
``input_layernorm``: the stream is ``hidden_states + residual`` (just ``hidden_states`` at layer 0).
Layers that take no ``residual`` receive the stream itself. Anything else (a layer with a ``residual``
parameter but no fused ``input_layernorm``, e.g. post-norm designs) is refused, as is compiled mode,
where the hooks' writes are not guaranteed to run: use ``enforce_eager=True``.
"""

from __future__ import annotations

from torch import nn

from ..capture import FusedCapture, UnsupportedTarget, decoder_layers, read_inputs, residual_stream_reader
from ..capture_ids import default_layer_ids


def add_eagle3_interface(model: nn.Module, num_layers: int, hidden_size: int) -> None:
    """Give ``model`` (an instance) the ``SupportsEagle3`` interface through fused capture."""
    layers = decoder_layers(model, num_layers)
    attach = read_inputs(residual_stream_reader(layers[0]))
    state: dict = {"capture": None}

    def set_aux_hidden_state_layers(layer_ids) -> None:
        if state["capture"] is not None:
            state["capture"].__exit__(None, None, None)
        capture = FusedCapture(model, tuple(sorted(layer_ids)), layers=layers, attach=attach,
                               hidden_size=hidden_size)
        state["capture"] = capture.__enter__()

    original_forward = model.forward

    def forward(*args, **kwargs):
        hidden_states = original_forward(*args, **kwargs)
        capture = state["capture"]
        if capture is None:
            return hidden_states
        h = hidden_size
        return hidden_states, [capture.features[..., i * h:(i + 1) * h] for i in range(3)]

    from vllm.model_executor.models.interfaces import SupportsEagle3
    for flag in ("has_own_embed_tokens", "has_own_lm_head"):  # the protocol's defaults, unless the model has them
        if not hasattr(model, flag):
            setattr(model, flag, getattr(SupportsEagle3, flag))
    model.supports_eagle3 = True
    model.set_aux_hidden_state_layers = set_aux_hidden_state_layers
    model.get_eagle3_default_aux_hidden_state_layers = lambda: default_layer_ids(num_layers)
    model.forward = forward


def install() -> None:
    """Before vLLM sets up aux hidden states, give a target without ``SupportsEagle3`` our capture."""
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._setup_eagle3_aux_hidden_state_outputs
    if getattr(original, "_eagle3_wrapped", False):
        return

    def setup(self) -> None:
        model = self.get_model()
        if self.use_aux_hidden_state_outputs and not supports_eagle3(model):
            if not self.model_config.enforce_eager:
                raise UnsupportedTarget(f"{type(model).__name__} has no SupportsEagle3 in vLLM; eagle3-plugin "
                                        "captures its layers with hooks, which needs enforce_eager=True")
            config = self.model_config.hf_config
            add_eagle3_interface(model, config.num_hidden_layers, config.hidden_size)
        original(self)

    setup._eagle3_wrapped = True
    GPUModelRunner._setup_eagle3_aux_hidden_state_outputs = setup
