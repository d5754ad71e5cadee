"""Drafts that obey a request's grammar in SGLang: its own matchers, read at every node of our tree.

SGLang verifies the whole tree under a request's grammar (``run_eagle_verify`` masks each node's logits, its own
traversal of our tree's links), so every node the draft proposes is worth masking. The worker drafts after verifying
and before the scheduler lists the step's tokens, when a request's ``req.grammar`` stands after its output before the
step: SGLang advanced it over the last step's tokens when it processed that step (its overlap scheduler off, as on
CPU with speculation) or in this step's verification (``grammar_barrier``, the overlap scheduler on). That is where
the core's :class:`~eagle3_plugin.grammar_drafts.DraftGrammars` expects it, and leaves it. Only xgrammar's grammars
(SGLang's default backend) expose a matcher; with another backend drafts stay unmasked.
"""

from __future__ import annotations

from ..grammar_drafts import DraftGrammars


def draft_grammars(reqs: list, emitted: list[list[int]], vocab_size: int) -> DraftGrammars:
    """The grammars of the batch's requests (``reqs``, rows in order) for one step's drafting, ``emitted`` being each
    row's tokens of this step."""
    matchers = {}
    for row, req in enumerate(reqs):
        matcher = getattr(req.grammar, "matcher", None)  # xgrammar's GrammarMatcher
        if matcher is not None and hasattr(matcher, "fill_next_token_bitmask"):
            matchers[row] = matcher
    return DraftGrammars(matchers, emitted, vocab_size, whole_tree=True)
