"""Each request's last proposed tree, kept by an engine from the step that drafts it to the one that verifies it."""

from __future__ import annotations

from typing import Optional

import torch

from .tree import DraftTree


class ProposedTrees:
    """Each request's last proposed tree, until the engine verifies it. Requests change rows between steps, and
    a step may propose for only some of them (a prompt batch beside running decodes, a token budget), so entries
    are kept per request; :meth:`drop` forgets finished ones."""

    def __init__(self):
        self._entries: dict = {}  # request id -> (the step's trees, its row)

    def set(self, trees: Optional[DraftTree], request_ids) -> None:
        if trees is None and not self._entries:  # nothing proposed, nothing to forget (steps under heavy load)
            return
        for row, rid in enumerate(request_ids):
            if trees is None:
                self._entries.pop(rid, None)
            else:
                self._entries[rid] = (trees, row)

    def drop(self, request_ids) -> None:
        for rid in request_ids:
            self._entries.pop(rid, None)

    def get(self, request_ids) -> tuple[Optional[DraftTree], torch.Tensor]:
        """The trees of ``request_ids`` as one batch (narrower ones padded with detached nodes); a request without
        one gets another's, flagged False in ``found [B]``."""
        entries = [self._entries.get(rid) for rid in request_ids]
        found = torch.tensor([e is not None for e in entries], dtype=torch.bool)
        known = [e for e in entries if e is not None]
        if not known:
            return None, found
        entries = [e if e is not None else known[0] for e in entries]
        batches = list({id(trees): trees for trees, _ in entries}.values())
        if len(batches) == 1:
            rows = [row for _, row in entries]
            if rows == list(range(batches[0].tokens.shape[0])):  # the same requests in the same order
                return batches[0], found
            return batches[0].select(torch.tensor(rows, device=batches[0].tokens.device)), found
        width = max(t.size for t in batches)
        return DraftTree.stack([trees.select(torch.tensor([row], device=trees.tokens.device)).padded(width)
                                for trees, row in entries]), found
