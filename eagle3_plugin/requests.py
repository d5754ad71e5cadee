"""Per-request speculation state for engines that batch requests their own way (vLLM, SGLang).

An engine reports, for each request it ran, the target's fused features of the tokens it processed and
what comes next; :class:`RequestSpeculator` keeps the request's draft cache in step and proposes its next
tree. Each request is drafted on its own (batch 1, plain torch): the reference path, not the fast one.

Invariant: after :meth:`extend` up to target position ``m - 1``, the request's draft cache holds draft
positions ``0 .. m - 1`` and its root (the last emitted token) sits at target position ``m``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import Eagle3Config
from .draft import Eagle3Draft
from .drafting import TreeDrafter
from .kv import DraftKVCache
from .sampler import SamplingParams, Verdict
from .tree import DraftTree


@dataclass
class _Request:
    kv: DraftKVCache
    root_hidden: torch.Tensor | None = None  # [1, H]: the draft's output at its last position
    tree: DraftTree | None = None  # proposed, not yet verified


class RequestSpeculator:
    def __init__(self, draft: Eagle3Draft, config: Eagle3Config, dtype, device):
        self.drafter = TreeDrafter(draft, config)
        self.dtype, self.device = dtype, device
        self._requests: dict[str, _Request] = {}

    def length(self, req_id: str) -> int:
        state = self._requests.get(req_id)
        return state.kv.length if state else 0

    def extend(self, req_id: str, start: int, next_tokens: torch.Tensor, features: torch.Tensor) -> None:
        """Feed target positions ``start .. start + n - 1``: ``features [n, 3H]`` and the token after each
        ``next_tokens [n]``. ``start == 0`` (re)starts the request; otherwise it must continue it."""
        if start == 0:
            self._requests[req_id] = _Request(self.drafter.new_cache(1, self.dtype, self.device))
        state = self._requests.get(req_id)
        if state is None or state.kv.length != start:
            raise RuntimeError(f"request {req_id}: draft state holds {self.length(req_id)} positions, "
                               f"the engine continues at {start}")
        n = next_tokens.shape[0]
        positions = torch.arange(start, start + n, device=self.device)[None]
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()[None]
        state.root_hidden = self.drafter.append(
            state.kv, next_tokens[None].to(self.device), features[None].to(self.dtype), positions, causal,
            torch.ones(1, n, dtype=torch.bool, device=self.device), last=torch.tensor([n - 1], device=self.device))
        state.tree = None

    def accept(self, req_id: str, verdict: Verdict, node_features: torch.Tensor) -> None:
        """Catch up on the verified tree's accepted path (``node_features [n, 3H]``: one per node verified)."""
        state = self._requests[req_id]
        tree, k = state.tree, int(verdict.num_accepted[0])
        path = verdict.accepted[0, :k + 1]
        next_tokens = torch.cat([tree.tokens[0, path[1:]], verdict.bonus[:1]])
        self.extend(req_id, state.kv.length, next_tokens, node_features[path])

    def propose(self, req_id: str, root_token: int, params: SamplingParams, generator=None) -> DraftTree:
        """Grow the request's next tree from ``root_token`` (``params``: one row)."""
        state = self._requests[req_id]
        root = torch.tensor([root_token], device=self.device)
        position = torch.tensor([state.kv.length - 1], device=self.device)
        state.tree = self.drafter.tree(state.kv, root, state.root_hidden, position, params, generator)
        return state.tree

    def pending_tree(self, req_id: str) -> DraftTree | None:
        state = self._requests.get(req_id)
        return state.tree if state else None

    def drop(self, req_id: str) -> None:
        self._requests.pop(req_id, None)
