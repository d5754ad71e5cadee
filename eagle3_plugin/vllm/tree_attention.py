"""Tree attention for the verification forward on vLLM's CPU attention backend, in plain torch.

The runner lays a request's tree out as consecutive query tokens (root first, topological order) with depth
positions; their keys and values are in the paged cache (the backend writes them before attending). The
backend's kernel attends causally in that flat order, which is wrong for a tree, so the rows of every tree
request (paths excepted: for them the kernel is right) are computed here, all requests in one masked attention
per layer: node ``i`` sees the request's whole prefix and the tree nodes that are its ancestors or itself. When
those rows are all the step's rows (every request decodes a tree), the kernel is not run at all.

The step's :class:`TreeAttention` travels on the attention metadata vLLM builds for the step (attribute
:data:`METADATA_ATTRIBUTE`), so it lives exactly as long as that step's metadata.

GPU path, next: the same ``allowed`` mask as a custom mask for FlashInfer, or a tree-aware Triton kernel.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from ..draft import grouped_mask, masked_attention
from . import paged_kv
from .speculative import ADDITIONAL_CONFIG_KEY

METADATA_ATTRIBUTE = "eagle3_tree"


@dataclass
class TreeAttention:
    """The step's tree requests: ``rows [R]`` (batch rows), ``queries [R, N]`` (flat index of each node's query
    token; only ``is_query`` nodes exist), and ``allowed [R, N, L]`` over positions ``0 .. L - 1``, ``L`` a
    multiple of the block size. ``whole_step``: these rows are every query token of the step (the kernel has nothing
    else to compute). ``dense``: besides, every row has ``N`` nodes and the rows follow each other, so the step's
    query tokens are the ``[R, N]`` nodes in order (a fixed tree at any batch): queries and outputs are read and
    written in place, not gathered and scattered. ``seconds``: time spent on tree rows, all layers."""

    rows: torch.Tensor
    queries: torch.Tensor
    is_query: torch.Tensor
    allowed: torch.Tensor
    whole_step: bool = False
    dense: bool = False
    seconds: float = 0.0
    _blocks: Optional[tuple] = None  # (block table it was read from, the rows' block ids): same for every layer
    _mask: Optional[torch.Tensor] = None  # ``allowed`` as the attention's additive mask: same for every layer

    def __post_init__(self):
        self.query_tokens = self.queries[self.is_query]  # flat indices of the real query tokens
        self.query_nodes = torch.nonzero(self.is_query.flatten())[:, 0]  # and where they are among the R x N rows

    @classmethod
    def build(cls, rows, flat_start, prefix_len, node_count, ancestors, block_size: int,
              whole_step: bool) -> "TreeAttention":
        """``flat_start``, ``prefix_len`` (the root's position) and ``node_count`` per tree row; ``ancestors
        [R, N, N]`` (each tree's ancestor mask)."""
        n = ancestors.shape[1]
        nodes = torch.arange(n)
        length = int((prefix_len + node_count).max())
        length = -(-length // block_size) * block_size
        positions = torch.arange(length)
        in_tree = positions[None] - prefix_len[:, None]  # [R, L]: node index of a tree position
        tree_part = torch.gather(ancestors, 2, in_tree.clamp(0, n - 1)[:, None, :].expand(-1, n, -1))
        tree_part &= ((in_tree >= 0) & (in_tree < node_count[:, None]))[:, None, :]
        allowed = tree_part | (in_tree < 0)[:, None, :]
        is_query = nodes[None] < node_count[:, None]
        dense = whole_step and bool(is_query.all()) and torch.equal(flat_start, torch.arange(len(rows)) * n)
        return cls(rows, flat_start[:, None] + torch.where(is_query, nodes, 0), is_query, allowed, whole_step, dense)

    def attend(self, query, kv_cache, block_table, output, scale: float) -> None:
        """Compute the tree rows of ``output [tokens, Hq, D]`` from ``query [tokens, Hq, D]``."""
        began = time.perf_counter()
        if self._blocks is None or self._blocks[0] is not block_table:
            blocks = block_table.index_select(0, self.rows)[:, :self.allowed.shape[2] // kv_cache.shape[2]]
            self._blocks = (block_table, blocks.long())
        keys, values = paged_kv.gather_blocks(kv_cache, self._blocks[1])
        r, n = self.queries.shape
        nodes = query[:r * n] if self.dense else query.index_select(0, self.queries.flatten())
        q = nodes.view(r, n, *query.shape[1:]).transpose(1, 2)  # [R, Hq, N, D]
        if self._mask is None:
            self._mask = grouped_mask(self.allowed, q.shape[1] // keys.shape[1], q.dtype)
        out = masked_attention(q, keys, values, self._mask, scale).transpose(1, 2)  # [R, N, Hq, D]
        if self.dense:
            output[:r * n].view(r, n, *output.shape[1:]).copy_(out)
        else:
            out = out.reshape(r * n, *query.shape[1:]).index_select(0, self.query_nodes)
            output.index_copy_(0, self.query_tokens, out.to(output.dtype))
        self.seconds += time.perf_counter() - began


def install() -> None:
    """Wrap ``CPUAttentionBackendImpl.forward``: tree requests' rows are computed here, the kernel runs for the rest.
    And in engines that run our worker, have the backend lay the cache out as we read it (:func:`_read_layout`)."""
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl, CPUAttentionMetadataBuilder

    original = CPUAttentionBackendImpl.forward
    if getattr(original, "_eagle3_wrapped", False):
        return
    _read_layout(CPUAttentionMetadataBuilder)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        tree = getattr(attn_metadata, METADATA_ATTRIBUTE, None)
        if tree is None or self.attn_type != AttentionType.DECODER:
            return original(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        if self.sliding_window != -1 or self.logits_soft_cap or self.alibi_slopes is not None or self.sinks is not None:
            raise NotImplementedError("eagle3-plugin tree attention supports plain causal attention only "
                                      "(no sliding window, soft cap, ALiBi or sinks)")
        if not tree.whole_step:  # the kernel computes the other rows (the tree rows' it computes are redone)
            original(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        heads, d = self.num_heads, self.head_size
        tree.attend(query.view(query.shape[0], heads, d), kv_cache, attn_metadata.block_table,
                  output.view(output.shape[0], heads, d), self.scale)
        return output

    forward._eagle3_wrapped = True
    CPUAttentionBackendImpl.forward = forward


def _read_layout(builder_cls) -> None:
    """In an engine with our worker (``additional_config["eagle3"]``), the CPU backend's cache layout (its ISA, chosen
    per KV group when the group's metadata builder is made, at start-up) must be one :mod:`.paged_kv` reads. vLLM
    picks ``amx`` for bfloat16 on CPUs with AMX; its ``vec`` kernels take bfloat16 too, in the layout we read, so
    such an engine runs them instead. Any other layout is refused here, at start-up, not at the first tree step (a
    step that raises takes the whole engine down)."""
    original = builder_cls.__init__

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        original(self, kv_cache_spec, layer_names, vllm_config, device)
        if ADDITIONAL_CONFIG_KEY not in (vllm_config.additional_config or {}):
            return
        runs = layout_we_read(self.isa)
        if runs != self.isa:
            self.isa = runs
            self._set_isa_to_layers(layer_names)
        paged_kv.check_isa(self.isa)

    builder_cls.__init__ = __init__


def layout_we_read(isa: str) -> str:
    """The CPU backend's ISA an engine with our worker runs where vLLM picks ``isa``: ``vec`` for ``amx``, else the
    same (refused at start-up unless :mod:`.paged_kv` reads it)."""
    return "vec" if isa == "amx" else isa
