"""The draft side of one speculation round, shared by the reference generator and the engines.

:class:`TreeDrafter` runs an :class:`~eagle3_plugin.draft.Eagle3Draft` over a ragged batch with a
:class:`~eagle3_plugin.kv.DraftKVCache`:

- ``append``: feed ``(token at p + 1, target feature at p)`` pairs at draft position ``p`` and keep their KV
  (prefill, and catch-up on an accepted path);
- ``tree``: grow the EAGLE-2 tree from the root; the frontier's KV lives in the cache only while the tree
  grows, so the cache is unchanged afterwards.

Position rule: the draft entry at position ``p`` pairs the target's feature at ``p`` with token ``p + 1``;
the root token sits at target position ``m`` and the tree's level ``L`` runs at draft position ``m - 1 + L``.
"""

from __future__ import annotations

import torch

from .config import Eagle3Config
from .draft import Eagle3Draft
from .kv import DraftKVCache
from .sampler import SamplingParams
from .tree import DraftTree, build_tree


class TreeDrafter:
    def __init__(self, draft: Eagle3Draft, config: Eagle3Config):
        self.draft, self.config = draft, config

    def new_cache(self, batch: int, dtype, device) -> DraftKVCache:
        c = self.draft.config
        return DraftKVCache(batch, c.num_key_value_heads, c.head_dim, dtype, device)

    def append(self, kv: DraftKVCache, input_ids, features, positions, allowed_new, new_valid, last):
        """Run the draft over new pairs (``features``: the target's fused captures, unfused ``[B, Q, 3H]``),
        append them to ``kv``; return each row's draft hidden state at query index ``last [B]``."""
        b, q = input_ids.shape
        allowed = torch.cat([kv.valid[:, None, :].expand(b, q, -1), allowed_new], dim=2)
        out, k, v = self.draft(input_ids, self.draft.fuse(features), positions, kv.keys, kv.values, allowed)
        kv.append(k, v, new_valid)
        return out[torch.arange(b, device=out.device), last]

    def tree(self, kv: DraftKVCache, root, root_hidden, root_position, params: SamplingParams,
             generator=None) -> DraftTree:
        """The round's tree; ``root_position [B]`` is the draft position of the root's hidden state."""
        cfg = self.config
        prefix_len = kv.length
        expand = _FrontierExpander(self.draft, kv, root_hidden, root_position)
        tree = build_tree(root, self.draft.logits(root_hidden), expand, cfg.depth, cfg.top_k, cfg.total_tokens,
                          params.temperature, cfg.tree_sampler == "real", self.draft.hot_token_ids, generator)
        kv.truncate(prefix_len)
        return tree


class _FrontierExpander:
    """The ``expand`` callback of :func:`build_tree` for the real draft.

    Level L's frontier runs at draft position ``root_position + L``, each node fed its parent's output
    and attending to the valid prefix, its ancestors in earlier frontiers and itself.
    """

    def __init__(self, draft: Eagle3Draft, draft_kv: DraftKVCache, root_hidden, root_position):
        self.draft, self.kv, self.root_position = draft, draft_kv, root_position
        self.prefix_valid = draft_kv.valid.clone()
        self.hidden = root_hidden[:, None]  # outputs of the previous frontier (the root's at first)
        self.ancestors = None  # [B, k, tree slots so far]: ancestor-or-self among earlier frontiers

    def __call__(self, level: int, tokens: torch.Tensor, parent_slot: torch.Tensor) -> torch.Tensor:
        b, k = tokens.shape
        h = self.hidden.shape[-1]
        parent_hidden = torch.gather(self.hidden, 1, parent_slot[..., None].expand(-1, -1, h))
        if self.ancestors is None:
            ancestors = torch.zeros(b, k, 0, dtype=torch.bool, device=tokens.device)
        else:
            ancestors = torch.gather(self.ancestors, 1, parent_slot[..., None].expand(-1, -1, self.ancestors.shape[2]))
        eye = torch.eye(k, dtype=torch.bool, device=tokens.device).expand(b, k, k)
        allowed = torch.cat([self.prefix_valid[:, None, :].expand(b, k, -1), ancestors, eye], dim=2)
        self.hidden, new_k, new_v = self.draft(tokens, parent_hidden, self.root_position[:, None] + level,
                                               self.kv.keys, self.kv.values, allowed)
        self.kv.append(new_k, new_v, torch.ones(b, k, dtype=torch.bool, device=tokens.device))
        self.ancestors = torch.cat([ancestors, eye], dim=2)
        return self.draft.logits(self.hidden)
