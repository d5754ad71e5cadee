"""Drafts that obey a request's grammar: an engine's grammar matchers read as the core's
:class:`~eagle3_plugin.output_rules.PathGrammars`.

An engine hands, per grammar row, an xgrammar ``GrammarMatcher`` (or anything with its ``accept_token(id) -> bool``,
``rollback(k)``, ``is_terminated()`` and ``fill_next_token_bitmask(bitmask, i)``) standing after the row's output
before the step; ``emitted`` are each row's tokens of the step, which the engine lists only after drafting. On entry
:class:`DraftGrammars` advances each matcher by its row's emitted tokens, the draft then asks what each grammar allows
after a node's path, and on exit (any exit) the matchers are rolled back to where the engine left them.

Which nodes are asked is the engine's verification: vLLM masks the target along a chain of drafts, so only a row's
leading path is read (``whole_tree`` False); SGLang masks every node of the tree (``whole_tree`` True). A mask changes
only what the draft proposes: verification is the engine's grammar and the target's law either way, so a matcher out
of step with the engine's would cost acceptance, never correctness.
"""

from __future__ import annotations

from typing import Optional

import torch


def advance(matcher, tokens: list[int]) -> int:
    """Accept ``tokens`` up to the first the grammar refuses or its end (where xgrammar would warn of each token);
    how many it accepted."""
    accepted = 0
    for token in tokens:
        if matcher.is_terminated() or not matcher.accept_token(token):
            break
        accepted += 1
    return accepted


_BITS = torch.arange(32, dtype=torch.int32)  # a bitmask word's bits, lowest first (xgrammar's layout)


class DraftGrammars:
    """With it, the rows' matchers (``{row: matcher}``) stand after the tokens the step emitted, read as the core's
    ``PathGrammars`` (None: no row's is: each was refused an emitted token or has ended); on exit they are rolled
    back."""

    def __init__(self, matchers: dict, emitted: list[list[int]], vocab_size: int, whole_tree: bool):
        self._matchers, self._emitted, self.vocab_size, self.whole_tree = matchers, emitted, vocab_size, whole_tree
        self._advanced: list[tuple[object, int]] = []
        self.rows: list[int] = []

    def __enter__(self) -> Optional["DraftGrammars"]:
        for row, matcher in self._matchers.items():
            accepted = advance(matcher, self._emitted[row])
            self._advanced.append((matcher, accepted))
            if accepted == len(self._emitted[row]) and not matcher.is_terminated():
                self.rows.append(row)
        return self if self.rows else None

    def __exit__(self, *exc) -> None:
        for matcher, accepted in self._advanced:
            if accepted:
                matcher.rollback(accepted)
        self._advanced = []

    def allowed_after(self, rows: list[int], paths: list[list[int]]) -> torch.Tensor:
        bitmask = torch.full((len(rows), (self.vocab_size + 31) // 32), -1, dtype=torch.int32)  # all allowed
        for i, (row, path) in enumerate(zip(rows, paths)):
            matcher = self._matchers[row]
            accepted = advance(matcher, path)
            if accepted == len(path) and not matcher.is_terminated():
                matcher.fill_next_token_bitmask(bitmask, i)
            if accepted:
                matcher.rollback(accepted)
        return ((bitmask[:, :, None] >> _BITS) & 1).flatten(1)[:, :self.vocab_size].bool()
