"""Sampling rules that read what a request has emitted (presence, frequency and repetition penalties,
``min_tokens``, allowed ids, bad words), applied at every node of a draft tree.

The target's logits at node ``n`` predict the token after the path root -> ``n``. Their rules see the request's
emitted tokens (the root, its last one, among them) followed by the path's draft tokens below the root, so each
node's logits are exactly those the engine would sample from had it emitted that path. Verification over them stays
lossless: greedy rows take their argmax, sampled rows the rejection rule with ``p`` from them.

Order and arithmetic are vLLM's sampler's (``Sampler.apply_logits_processors``): ids outside ``allowed_token_ids``,
then bad words, then ``min_tokens`` (stop ids held back), then the penalties (``apply_penalties``): repetition
(for ids in the prompt or the context, a logit > 0 times ``1 / r``, else times ``r``), frequency (minus ``f`` times
the id's count in the context), presence (minus ``p`` where it occurs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from .tree import DraftTree


@dataclass
class HeldBack:
    """``min_tokens`` for one row: its stop ids stay masked at nodes of depth below ``remaining`` (its
    ``min_tokens`` less what it has emitted). ``restore``: unmask them where masking leaves no id at all (vLLM
    does so for requests with structured output, whose grammar may allow nothing else)."""

    remaining: int
    stop_ids: list[int]
    restore: bool = False


@dataclass
class OutputRules:
    """Per batch row ``b``. Rows without penalties have ``presence 0, frequency 0, repetition 1``.

    ``emitted``: each row's emitted tokens, read by the penalties and bad words (rows with neither may be empty).
    ``prompt [B, P]``: prompt ids padded with the vocabulary size, for the repetition penalty (None: no row has
    penalties). ``banned [B, V]``: True for ids the row may not emit (None: no row restricts them)."""

    emitted: list[list[int]]
    prompt: Optional[torch.Tensor] = None
    presence: Optional[torch.Tensor] = None
    frequency: Optional[torch.Tensor] = None
    repetition: Optional[torch.Tensor] = None
    held_back: dict[int, HeldBack] = field(default_factory=dict)
    banned: Optional[torch.Tensor] = None
    bad_words: dict[int, list[list[int]]] = field(default_factory=dict)

    @property
    def has_penalties(self) -> bool:
        return self.prompt is not None

    def apply(self, tree: DraftTree, logits: torch.Tensor) -> torch.Tensor:
        """``logits [B, N, V]`` float, node ``j`` of row ``b`` the target's after that node: each node's adjusted for
        its context, in place (returned)."""
        if self.banned is not None:
            logits.masked_fill_(self.banned[:, None, :], float("-inf"))
        for row, words in self.bad_words.items():
            contexts = _contexts(tree, row, self.emitted[row])
            for node, context in enumerate(contexts):
                logits[row, node, _completed_bad_words(words, context)] = float("-inf")
        for row, held in self.held_back.items():
            _hold_back(logits[row], tree.depths[row], held)
        if self.has_penalties:
            _penalise(logits, tree, self)
        return logits


def _contexts(tree: DraftTree, row: int, emitted: list[int]) -> list[list[int]]:
    """Per node of ``row``: the emitted tokens, then the draft tokens on the path below the root to the node."""
    tokens, parents = tree.tokens[row].tolist(), tree.parents[row].tolist()
    paths: list[list[int]] = []
    for node, parent in enumerate(parents):  # topological: a parent comes before its children
        paths.append([] if parent < 0 else paths[parent] + [tokens[node]])
    return [emitted + path for path in paths]


def _completed_bad_words(words: list[list[int]], context: list[int]) -> list[int]:
    """The last id of each bad word whose other ids end ``context`` (emitting it would complete the word)."""
    found = []
    for word in words:
        prefix = word[:-1]
        if len(prefix) <= len(context) and context[len(context) - len(prefix):] == prefix:
            found.append(word[-1])
    return found


def _hold_back(logits: torch.Tensor, depths: torch.Tensor, held: HeldBack) -> None:
    """``logits [N, V]`` of one row: its stop ids masked at nodes shallower than ``held.remaining``."""
    nodes = torch.nonzero(depths < held.remaining)[:, 0]
    if nodes.numel() == 0 or not held.stop_ids:
        return
    ids = torch.tensor(held.stop_ids, dtype=torch.long)
    at = (nodes[:, None], ids[None])
    before = logits[at]
    logits[at] = float("-inf")
    if held.restore:
        nothing_left = torch.isneginf(logits[nodes]).all(-1)
        logits[at] = torch.where(nothing_left[:, None], before, logits[at])


def _penalise(logits: torch.Tensor, tree: DraftTree, rules: OutputRules) -> None:
    """The penalties at every node of the rows that have them, with each node's context counts."""
    rows = torch.nonzero((rules.presence != 0) | (rules.frequency != 0) | (rules.repetition != 1))[:, 0]
    if rows.numel() == 0:
        return
    b, n, v = rows.numel(), logits.shape[1], logits.shape[2]
    emitted = [rules.emitted[r] for r in rows.tolist()]
    width = max(1, max(len(e) for e in emitted))
    padded = torch.tensor([e + [v] * (width - len(e)) for e in emitted], dtype=torch.long)
    counts = torch.zeros(b, v + 1, dtype=torch.long).scatter_add_(1, padded, torch.ones_like(padded))
    below_root = tree.ancestor_mask()[rows] & (torch.arange(n) > 0)  # [b, n, n]: j on the path to i, not the root
    on_path = torch.zeros(b, n, v + 1, dtype=torch.long)
    on_path.scatter_add_(2, tree.tokens[rows][:, None, :].expand(b, n, n).clamp(0, v), below_root.long())
    counts = (counts[:, None, :] + on_path)[..., :v]  # [b, n, v]
    in_prompt = torch.zeros(b, v + 1, dtype=torch.bool).scatter_(1, rules.prompt[rows], True)[:, :v]
    seen = counts > 0
    x = logits[rows]
    penalty = torch.where(in_prompt[:, None, :] | seen, rules.repetition[rows][:, None, None], 1.0)
    x *= torch.where(x > 0, 1.0 / penalty, penalty)
    x -= rules.frequency[rows][:, None, None] * counts
    x -= rules.presence[rows][:, None, None] * seen
    logits[rows] = x
