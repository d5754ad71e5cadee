"""Drafts that obey a request's grammar in SGLang: its own matchers, read at every node of our tree; and the masks
SGLang verifies our tree with, reusing what the draft read.

SGLang verifies the whole tree under a request's grammar (``run_eagle_verify`` masks each node's logits), so every
node the draft proposes is worth masking. The worker drafts after verifying and before the scheduler lists the step's
tokens, when a request's ``req.grammar`` stands after its output before the step: SGLang advanced it over the last
step's tokens when it processed that step (its overlap scheduler off, as on CPU with speculation) or in this step's
verification (``grammar_barrier``, the overlap scheduler on). That is where the core's
:class:`~eagle3_plugin.grammar_drafts.DraftGrammars` expects it, and leaves it. Only xgrammar's grammars (SGLang's
default backend) expose a matcher; with another backend drafts stay unmasked and SGLang builds its masks itself.

At the next step SGLang verifies that tree from the same state, so the masks the draft read (``DraftGrammars.kept``:
the tree's inner nodes, mostly) are the verify masks of those nodes. :func:`build_grammar_vocab_mask` stands in for
SGLang's while our worker verifies (:func:`verifying_with`): the same rows as its ``generate_token_bitmask`` (a node is
visited where its parent was and the parent's mask allows its token; a visited node's row holds what the grammar
allows after its path, unless the grammar has ended there; other rows allow everything), the kept ones reused and the
rest (the leaves, mostly) filled from the request's matcher.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from ..grammar_drafts import DraftGrammars, PathWalk

_kept: Optional[dict] = None  # while our worker verifies: {rid: {path: packed mask}}, what drafting the trees read


def draft_grammars(reqs: list, emitted: list[list[int]], vocab_size: int) -> DraftGrammars:
    """The grammars of the batch's requests (``reqs``, rows in order) for one step's drafting, ``emitted`` being each
    row's tokens of this step."""
    matchers = {row: req.grammar.matcher for row, req in enumerate(reqs) if _matcher(req) is not None}
    return DraftGrammars(matchers, emitted, vocab_size, whole_tree=True)


@contextlib.contextmanager
def verifying_with(kept: dict):
    """While our worker verifies: SGLang's grammar masks from :func:`tree_bitmask`, reusing ``kept``."""
    global _kept
    _kept = kept
    try:
        yield
    finally:
        _kept = None


def build_grammar_vocab_mask(original, *, reqs, tree, sampling_info, device, barrier):
    """AROUND SGLang's ``build_grammar_vocab_mask``: :func:`tree_bitmask` while our worker verifies (every grammar
    request an xgrammar one), SGLang's own otherwise."""
    if _kept is None or any(req.grammar is not None and _matcher(req) is None for req in reqs):
        return original(reqs=reqs, tree=tree, sampling_info=sampling_info, device=device, barrier=barrier)
    from sglang.srt.constrained.base_grammar_backend import GrammarMask

    if barrier is not None:
        barrier()
    bitmask, grammar = tree_bitmask(reqs, *tree.resolve(), sampling_info.vocab_size, _kept)
    if bitmask is None:
        return None
    sampling_info.grammar_mask = None  # as SGLang's: else the extend stage's leftover mask is applied instead
    return GrammarMask(grammar, bitmask.to(device, non_blocking=True))


def tree_bitmask(reqs: list, next_token: torch.Tensor, next_sibling: torch.Tensor, tokens: torch.Tensor,
                 vocab_size: int, kept: dict):
    """SGLang's verify masks over the batch's trees (links and tokens ``[B, N]``, nodes in topological order), as its
    ``generate_token_bitmask`` returns them (the bitmask, any request's grammar; None, None without a grammar)."""
    grammar = next((req.grammar for req in reqs if req.grammar is not None), None)
    if grammar is None:
        return None, None
    b, n = tokens.shape
    bitmask = grammar.allocate_vocab_mask(vocab_size=vocab_size, batch_size=b * n, device="cpu")
    for row, req in enumerate(reqs):
        if req.grammar is not None:
            _fill_tree(bitmask[row * n:(row + 1) * n], req.grammar.matcher, next_token[row].tolist(),
                       next_sibling[row].tolist(), tokens[row].tolist(), vocab_size, kept.get(req.rid, {}))
    return bitmask, grammar


def _fill_tree(rows: torch.Tensor, matcher, next_token: list, next_sibling: list, tokens: list, vocab_size: int,
               kept: dict) -> None:
    parent = [-1] * len(tokens)
    for node, child in enumerate(next_token):
        while child != -1:
            parent[child], child = node, next_sibling[child]
    paths: list[Optional[tuple]] = [None] * len(tokens)  # each visited node's path below the root
    walk = PathWalk(0, matcher)
    try:
        for node, token in enumerate(tokens):
            if node > 0:
                above = paths[parent[node]]
                if above is None or token >= vocab_size or not (int(rows[parent[node], token // 32]) >> token % 32) & 1:
                    continue
            path = () if node == 0 else paths[parent[node]] + (token,)
            paths[node] = path
            mask = kept.get(path)
            if mask is not None and mask.shape == rows[node].shape:
                rows[node] = mask
            elif walk.reach(list(path)):
                matcher.fill_next_token_bitmask(rows, node)
    finally:
        walk.leave()


def _matcher(req):
    matcher = getattr(req.grammar, "matcher", None)  # xgrammar's GrammarMatcher
    return matcher if matcher is not None and hasattr(matcher, "fill_next_token_bitmask") else None
