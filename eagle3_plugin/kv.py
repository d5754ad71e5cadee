"""The reference generator's target cache with ragged rows: a key-validity mask per slot and right-aligned compaction.

Rows of a batch hold different numbers of tokens. The cache is a set of per-layer tensors ``[B, H_kv, L, D]``
plus ``valid [B, L]``; a forward appends the same number of slots to every row (padding slots are simply marked
invalid), and :func:`compaction_index` later keeps only the slots a row still needs, right-aligned so each
row's tokens stay contiguous and in order.
"""

from __future__ import annotations

import torch


def compaction_index(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Given ``keep [B, L]`` (bool), return ``index [B, L']`` and ``valid [B, L']``.

    ``index`` lists each row's kept slots in their original order, right-aligned, ``L'`` being the
    largest kept count; the padding on the left points at slot 0 and is marked invalid.
    """
    counts = keep.sum(dim=1)
    width = int(counts.max()) if keep.numel() else 0
    order = torch.sort(keep.to(torch.int8), dim=1, stable=True).indices  # dropped first, kept last, in order
    index = order[:, keep.shape[1] - width:]
    valid = torch.arange(width, device=keep.device)[None, :] >= (width - counts)[:, None]
    return torch.where(valid, index, torch.zeros_like(index)), valid


def gather_slots(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Select slots ``index [B, L']`` along dim 2 of ``tensor [B, H, L, D]``."""
    b, h, _, d = tensor.shape
    return torch.gather(tensor, 2, index[:, None, :, None].expand(b, h, index.shape[1], d))


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool ``allowed [B, Q, K]`` -> float mask ``[B, 1, Q, K]`` (0 where allowed, dtype min elsewhere)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]
