"""Plain-torch access to vLLM's paged KV cache: the target's layers as CPU_ATTN lays them out for the ``vec``
ISA, and the draft's layer in our own layout.

One layer's cache is ``[num_blocks, num_kv_heads, block_size, 2 * head_size]``. For the target's layers each
(block, head) holds its keys *element-major*, ``[head_size, block_size]``, then its values token-major,
``[block_size, head_size]`` (read back from ``cpu_attn_reshape_and_cache``; tests/vllm/test_vllm_paged_kv.py
checks it against the kernel). Position ``p`` of a request lives in slot ``block_table[p // block_size] *
block_size + p % block_size``. Other ISAs pack blocks differently: an engine with our worker runs ``vec`` where
vLLM would pick ``amx`` (bfloat16 on an AMX CPU) and refuses the others at start-up (:mod:`.tree_attention`).

The draft's layer is vLLM's too (its EAGLE drafter's attention layer: vLLM budgets, allocates, frees and
prefix-caches its blocks), but only our draft reads and writes it, so it is laid out for our reads: each slot's
keys then values, token-major (:func:`draft_store`).
"""

from __future__ import annotations

import torch

from ..speculator import DraftKV

SUPPORTED_ISAS = ("vec",)


class UnsupportedKVLayout(RuntimeError):
    pass


def check_isa(isa: str) -> None:
    if isa not in SUPPORTED_ISAS:
        raise UnsupportedKVLayout(f"eagle3-plugin's tree attention reads the CPU_ATTN cache in the layout of the "
                                  f"{', '.join(SUPPORTED_ISAS)} ISA; this engine's is {isa!r}: serve a target whose "
                                  "head size is a multiple of 32 on x86, or use vLLM's native chain")


def key_value_caches(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of one layer's cache: keys ``[blocks, heads, head_size, block_size]``, values ``[blocks, heads,
    block_size, head_size]``."""
    blocks, heads, block_size, two_d = kv_cache.shape
    d = two_d // 2
    flat = kv_cache.view(blocks, heads, 2 * block_size * d)
    keys = flat[..., :block_size * d].view(blocks, heads, d, block_size)
    values = flat[..., block_size * d:].view(blocks, heads, block_size, d)
    return keys, values


def gather(kv_cache: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values at ``slots [n]``, each ``[n, heads, head_size]``."""
    keys, values = key_value_caches(kv_cache)
    block_size = values.shape[2]
    blocks, offsets = slots // block_size, slots % block_size
    return keys[blocks, :, :, offsets], values[blocks, :, offsets]


def move_slots(layers: list[tuple[torch.Tensor, torch.Tensor]], src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy keys and values from slots ``src`` to slots ``dst`` in every layer of ``layers`` (each layer's
    :func:`key_value_caches`). Callers move a path's nodes to their depths: every destination precedes its source,
    and no later source is an earlier destination."""
    block_size = layers[0][1].shape[2]
    sb, so, db, do = src // block_size, src % block_size, dst // block_size, dst % block_size
    for keys, values in layers:
        keys[db, :, :, do] = keys[sb, :, :, so]
        values[db, :, do] = values[sb, :, so]


def block_slots(block_table: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """``[B, length]``: the slot of each position ``0 .. length - 1`` of each row of ``block_table [B, blocks]``."""
    positions = torch.arange(length, device=block_table.device)
    return block_table[:, positions // block_size].long() * block_size + positions % block_size


def gather_blocks(kv_cache: torch.Tensor, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of whole blocks ``block_ids [R, n]`` (int64) in position order: each ``[R, heads, n *
    block_size, head_size]`` (one block copy, then one transposing copy each)."""
    _, heads, block_size, two_d = kv_cache.shape
    d = two_d // 2
    r, n = block_ids.shape
    blocks = kv_cache.index_select(0, block_ids.flatten()).view(r, n, heads, 2, block_size * d)
    keys = blocks[:, :, :, 0].view(r, n, heads, d, block_size).permute(0, 2, 1, 4, 3).reshape(r, heads, -1, d)
    values = blocks[:, :, :, 1].view(r, n, heads, block_size, d).transpose(1, 2).reshape(r, heads, -1, d)
    return keys, values


def draft_store(kv_cache: torch.Tensor) -> DraftKV:
    """The draft layer's cache as our store: slot ``s`` (block ``s // block_size``) holds its keys then its values."""
    blocks, heads, block_size, two_d = kv_cache.shape
    by_slot = kv_cache.view(blocks * block_size, 2, heads, two_d // 2)
    return DraftKV(by_slot[:, 0], by_slot[:, 1])
