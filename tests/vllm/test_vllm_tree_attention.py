"""Tree attention over the paged cache: every node attends to its request's prefix and to its ancestors and itself,
as a plain softmax over exactly those positions computes; the dense path (every row a whole tree, rows back to
back: queries and outputs in place) gives the same numbers as the general one (gathered and scattered)."""

import dataclasses

import torch

from eagle3_plugin.tree import DraftTree
from eagle3_plugin.vllm import paged_kv
from eagle3_plugin.vllm.tree_attention import TreeAttention

BLOCK, HEADS, KV_HEADS, D, SCALE = 16, 4, 2, 32, 0.2


def trees(g: torch.Generator, rows: int, n: int) -> DraftTree:
    """Random trees: node ``i``'s parent is any earlier node."""
    parents = torch.full((rows, n), -1)
    depths = torch.zeros(rows, n, dtype=torch.long)
    for i in range(1, n):
        parents[:, i] = torch.randint(0, i, (rows,), generator=g)
        depths[:, i] = depths.gather(1, parents[:, i:i + 1])[:, 0] + 1
    return DraftTree(torch.zeros(rows, n, dtype=torch.long), parents, depths)


def reference(query, kv_cache, block_table, prefix, tree, flat_start, node_count):
    """Each node's attention computed alone: keys of positions ``0 .. prefix - 1`` and of its ancestors-or-self."""
    out = torch.full_like(query, float("nan"))
    ancestors = tree.ancestor_mask()
    for r in range(tree.tokens.shape[0]):
        slots = paged_kv.block_slots(block_table[r:r + 1], int(prefix[r]) + tree.size, BLOCK)[0]
        keys, values = paged_kv.gather(kv_cache, slots)  # [L, Hkv, D]
        for i in range(int(node_count[r])):
            seen = torch.cat([torch.arange(int(prefix[r])), prefix[r] + torch.nonzero(ancestors[r, i])[:, 0]])
            for h in range(HEADS):
                k, v = keys[seen, h // (HEADS // KV_HEADS)], values[seen, h // (HEADS // KV_HEADS)]
                weights = torch.softmax(query[flat_start[r] + i, h] @ k.T * SCALE, dim=0)
                out[flat_start[r] + i, h] = weights @ v
    return out


def attended(attention, query, kv_cache, block_table):
    out = torch.full_like(query, float("nan"))  # rows it does not compute stay NaN
    attention.attend(query, kv_cache, block_table, out, SCALE)
    return out


def test_tree_rows_attend_to_their_prefix_and_ancestors():
    g = torch.Generator().manual_seed(0)
    rows, n = 3, 6
    prefix = torch.tensor([5, 16, 33])  # the root's position: within a block, at a block's start, past two
    tree = trees(g, rows, n)
    block_table = torch.randperm(24, generator=g).view(rows, 8).int()
    kv_cache = torch.randn(24, KV_HEADS, BLOCK, 2 * D, generator=g)
    query = torch.randn(rows * n, HEADS, D, generator=g)
    whole = torch.full((rows,), n)
    dense = TreeAttention.build(torch.arange(rows), torch.arange(rows) * n, prefix, whole, tree.ancestor_mask(), BLOCK,
                                whole_step=True)
    assert dense.dense
    want = reference(query, kv_cache, block_table, prefix, tree, torch.arange(rows) * n, whole)
    for path in (dense, dataclasses.replace(dense, dense=False)):  # in place, and gathered and scattered
        torch.testing.assert_close(attended(path, query, kv_cache, block_table), want, rtol=1e-5, atol=1e-5,
                                   equal_nan=True)

    cut = torch.tensor([n, 4, n])  # a tree the scheduler cut short: the general path, its last nodes not computed
    flat_start = torch.tensor([0, n, n + 4])
    short = TreeAttention.build(torch.arange(rows), flat_start, prefix, cut, tree.ancestor_mask(), BLOCK,
                                whole_step=True)
    assert not short.dense
    want = reference(query, kv_cache, block_table, prefix, tree, flat_start, cut)
    torch.testing.assert_close(attended(short, query, kv_cache, block_table), want, rtol=1e-5, atol=1e-5,
                               equal_nan=True)
