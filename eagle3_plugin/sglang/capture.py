"""Fused capture in SGLang targets, any decoder (not only the models implementing ``set_eagle3_layers_to_capture``).

SGLang 0.5.23 decoder layers built on its layer boundaries take ``capture_output``: a callback their
attention boundary calls with the residual stream entering the layer (the model's own aux capture passes
it only for its configured layers). We pass our writer there for the three layers we capture, so the stream
is read where SGLang itself reads it. Older-style layers taking ``(positions, hidden_states, residual)``
are read from their inputs (:func:`~eagle3_plugin.capture.residual_stream_reader`).

Ids follow our rule (id ``i`` is the stream entering layer ``i``); SGLang's configured ids are ours - 1.
"""

from __future__ import annotations

import inspect

from torch import nn
from torch.utils.hooks import RemovableHandle

from ..capture import FusedCapture, WriteFn, decoder_layers, read_inputs, residual_stream_reader


def attach(layer: nn.Module, write: WriteFn) -> RemovableHandle:
    params = list(inspect.signature(layer.forward).parameters)
    if "capture_output" not in params:
        return read_inputs(residual_stream_reader(layer))(layer, write)
    index = params.index("capture_output")

    def callback(hidden, **_):  # SGLang may pass owned=...; we copy either way
        write(hidden)

    def pass_callback(module, args, kwargs):
        if len(args) > index:
            args = args[:index] + (callback,) + args[index + 1:]
        else:
            kwargs["capture_output"] = callback
        return args, kwargs

    return layer.register_forward_pre_hook(pass_callback, with_kwargs=True)


def target_capture(model: nn.Module, layer_ids, num_layers: int, hidden_size: int) -> FusedCapture:
    """A :class:`FusedCapture` of ``model``'s layers ``layer_ids`` (ours), not yet entered."""
    return FusedCapture(model, layer_ids, layers=decoder_layers(model, num_layers), attach=attach,
                        hidden_size=hidden_size)
