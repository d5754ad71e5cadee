"""Tree attention for the verification forward on vLLM's CPU attention backend, in plain torch.

The runner lays a request's tree out as consecutive query tokens (root first, topological order) with
depth positions; their keys and values are already in the paged cache (the backend writes them before
attending). The backend's kernel attends causally in that flat order, which is wrong for a tree, so
after it runs, the rows of every tree request are recomputed here: query ``i`` sees the request's whole
prefix and the tree nodes ``j`` with ``ancestor_mask[i, j]`` (its ancestors and itself).

GPU path, next: the same mask as a per-request custom mask for FlashInfer / a Triton tree-attention
kernel; :class:`TreeBatch` is already the per-request description such a kernel needs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from . import paged_kv


@dataclass
class TreeBatch:
    """The verification forward's trees: batch row -> ``ancestor_mask [n, n]`` (bool) for its ``n`` query tokens."""

    masks: dict[int, torch.Tensor] = field(default_factory=dict)
    seconds: float = 0.0  # spent redoing tree rows, all layers (the plugin's cost in the forward)


_current: TreeBatch | None = None


def set_current(batch: TreeBatch | None) -> None:
    """The runner sets the batch before the target forward and clears it after."""
    global _current
    _current = batch if batch is not None and batch.masks else None


def attend(query: torch.Tensor, kv_cache: torch.Tensor, block_row: torch.Tensor, seq_len: int,
           ancestor_mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of one request's ``n`` tree queries ``[n, Hq, d]`` over its paged cache -> ``[n, Hq, d]``.

    Keys ``0 .. seq_len - n - 1`` are the prefix (visible to all); the last ``n`` are the tree's nodes.
    """
    n, heads, d = query.shape
    slots = paged_kv.slots_of(block_row, seq_len, kv_cache.shape[2])
    keys, values = (x.float() for x in paged_kv.gather(kv_cache, slots))
    group = heads // keys.shape[1]
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    allowed = torch.cat([torch.ones(n, seq_len - n, dtype=torch.bool, device=query.device), ancestor_mask], dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float(), keys) * scale
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), values).to(query.dtype)


def install() -> None:
    """Wrap ``CPUAttentionBackendImpl.forward``: run the kernel, then redo tree requests' rows here."""
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    original = CPUAttentionBackendImpl.forward
    if getattr(original, "_eagle3_wrapped", False):
        return

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        result = original(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        batch = _current
        if batch is None or attn_metadata is None or self.attn_type != AttentionType.DECODER:
            return result
        if self.sliding_window != -1 or self.logits_soft_cap or self.alibi_slopes is not None or self.sinks is not None:
            raise NotImplementedError("eagle3-plugin tree attention supports plain causal attention only "
                                      "(no sliding window, soft cap, ALiBi or sinks)")
        paged_kv.check_isa(layer.isa)
        began = time.perf_counter()
        heads, d = self.num_heads, self.head_size
        out = output.view(output.shape[0], heads, d)
        q = query.view(query.shape[0], heads, d)
        starts, seq_lens = attn_metadata.query_start_loc.tolist(), attn_metadata.seq_lens.tolist()
        for row, mask in batch.masks.items():
            start, n = starts[row], mask.shape[0]
            if starts[row + 1] - start != n:
                raise RuntimeError(f"tree row {row}: {starts[row + 1] - start} query tokens, tree has {n}")
            out[start:start + n] = attend(q[start:start + n], kv_cache, attn_metadata.block_table[row],
                                          seq_lens[row], mask, self.scale)
        batch.seconds += time.perf_counter() - began
        return result

    forward._eagle3_wrapped = True
    CPUAttentionBackendImpl.forward = forward


