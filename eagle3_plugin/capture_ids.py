"""The one capture-index rule, and the conversions to the other projects' conventions.

**Our rule.** Capture id ``i`` (0-based) names the residual stream that *enters* decoder layer ``i``:
the sum of hidden state and residual after layer ``i - 1`` (the embeddings for ``i = 0``). In a
Hugging Face model that is ``output_hidden_states[i]``. Valid ids are ``0 .. n_layers - 1`` and a
draft needs three distinct ids in increasing order (low, mid, high).

Other conventions, mapped onto ours:

- EAGLE (SafeAILab) captures the input of layers 2, n//2, n-3: its ids are ours.
- vLLM ``SupportsEagle3``: aux id L is the state after decoder layer L-1, i.e. the input of layer L:
  its ids are ours.
- SGLang: configured id i captures the *output* of layer i (the input of layer i + 1): ours = SGLang + 1.
"""

from __future__ import annotations

CONVENTIONS = ("ours", "eagle", "vllm", "sglang")
_OFFSET_TO_OURS = {"ours": 0, "eagle": 0, "vllm": 0, "sglang": 1}


class LayerIdError(ValueError):
    """Raised for capture ids that are out of range, repeated or not increasing."""


def validate_layer_ids(layer_ids, num_layers: int) -> tuple[int, int, int]:
    """Return ``layer_ids`` as a tuple after checking: three ints, distinct, increasing, in range."""
    ids = tuple(layer_ids)
    if len(ids) != 3 or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise LayerIdError(f"layer_ids must be three integers (low, mid, high), got {list(ids)}")
    if len(set(ids)) != 3:
        raise LayerIdError(f"layer_ids must be three distinct layers, got {list(ids)}")
    if list(ids) != sorted(ids):
        raise LayerIdError(f"layer_ids must be increasing (low, mid, high), got {list(ids)}")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise LayerIdError(
            f"layer_ids {list(ids)}: {bad} out of range for a target with {num_layers} layers "
            f"(valid ids are 0..{num_layers - 1}: id i is the input of decoder layer i)"
        )
    return ids


def default_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE's (2, n//2, n-3) where those are distinct, else the most spread distinct triple.

    The usual default collides for n < 7 (n = 6 gives (2, 3, 3)); small targets then get
    (1, n//2, n-1), and n = 3 gets (0, 1, 2).
    """
    if num_layers < 3:
        raise LayerIdError(f"EAGLE-3 needs a target with at least 3 layers, got {num_layers}")
    for ids in ((2, num_layers // 2, num_layers - 3), (1, num_layers // 2, num_layers - 1), (0, 1, 2)):
        if ids[0] < ids[1] < ids[2] < num_layers:
            return ids
    raise AssertionError("unreachable: (0, 1, 2) is valid for n >= 3")


def to_ours(layer_ids, convention: str) -> tuple[int, ...]:
    """Convert ids written in ``convention`` to ours."""
    return tuple(int(i) + _offset(convention) for i in layer_ids)


def from_ours(layer_ids, convention: str) -> tuple[int, ...]:
    """Convert our ids to ``convention``."""
    return tuple(int(i) - _offset(convention) for i in layer_ids)


def _offset(convention: str) -> int:
    try:
        return _OFFSET_TO_OURS[convention]
    except KeyError:
        raise ValueError(f"unknown layer-id convention {convention!r}; expected one of {CONVENTIONS}") from None
