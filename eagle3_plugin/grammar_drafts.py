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

import sys
from typing import Optional

import numpy as np
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


def _unpack(bitmask: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """xgrammar's bitmasks ``[n, words]`` int32 (id ``32 w + j`` is bit ``j`` of word ``w``, lowest first) as ``[n,
    len(ids)]`` bool at ``ids`` (numpy's bit unpacking: ~5x torch's shifts and gather here)."""
    words = bitmask.numpy()
    if sys.byteorder != "little":
        words = words.byteswap()
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")
    return torch.from_numpy(np.take(bits, ids.numpy(), axis=1)).view(torch.bool)


class DraftGrammars:
    """With it, the rows' matchers (``{row: matcher}``) stand after the tokens the step emitted, read as the core's
    ``PathGrammars`` (None: no row's is: each was refused an emitted token or has ended); on exit they are rolled
    back. ``kept`` (``whole_tree`` only): each row's packed mask (xgrammar's bitmask row) after each path it was asked
    about, ``{row: {path: mask}}``, all ones where the path leaves the grammar or ends it (the engine verifies the
    tree under the same grammar and can reuse them)."""

    def __init__(self, matchers: dict, emitted: list[list[int]], vocab_size: int, whole_tree: bool):
        self._matchers, self._emitted, self.vocab_size, self.whole_tree = matchers, emitted, vocab_size, whole_tree
        self._advanced: list[tuple[object, int]] = []
        self.rows: list[int] = []
        self.kept: dict[int, dict[tuple, torch.Tensor]] = {}

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

    def allowed_after(self, rows: list[int], paths: list[list[int]],
                      columns: Optional[torch.Tensor] = None) -> torch.Tensor:
        bitmask = torch.full((len(rows), (self.vocab_size + 31) // 32), -1, dtype=torch.int32)  # all allowed
        fill_bitmasks(bitmask, [(rows[i], self._matchers[rows[i]], paths[i], i) for i in range(len(rows))])
        if self.whole_tree:  # the engine verifies these nodes under the same grammar: it may reuse the masks
            for i, (row, path) in enumerate(zip(rows, paths)):
                self.kept.setdefault(row, {})[tuple(path)] = bitmask[i]
        return _unpack(bitmask, torch.arange(self.vocab_size) if columns is None else columns.cpu())


def fill_bitmasks(bitmask: torch.Tensor, asked: list[tuple]) -> None:
    """For each ``(key, matcher, path, index)`` of ``asked``: fill ``bitmask[index]`` with what the matcher allows after
    ``path`` (left as it is where the path leaves the grammar or ends it), the matcher left where it was. Each key's
    paths are walked in order, as a trie: a node's path shares its parent's and often its siblings' prefixes."""
    walk = None
    try:
        for key, matcher, path, index in sorted(asked, key=lambda a: (a[0], a[2])):
            if walk is None or walk.key != key:
                if walk is not None:
                    walk.leave()
                walk = PathWalk(key, matcher)
            if walk.reach(path):
                matcher.fill_next_token_bitmask(bitmask, index)
    finally:
        if walk is not None:
            walk.leave()


class PathWalk:
    """A matcher walked from path to path: it rolls back only past the prefix the next path shares with the
    last, and accepts only the rest; :meth:`leave` puts it back where it was."""

    def __init__(self, key, matcher):
        self.key, self.matcher, self.path = key, matcher, []  # the tokens it has accepted here

    def reach(self, path: list[int]) -> bool:
        """Stand after ``path`` (True), or after the longest prefix of it the grammar takes (False; also where the
        grammar has ended there)."""
        common = 0
        while common < min(len(self.path), len(path)) and self.path[common] == path[common]:
            common += 1
        if common < len(self.path):
            self.matcher.rollback(len(self.path) - common)
            del self.path[common:]
        rest = path[common:]
        accepted = advance(self.matcher, rest)
        self.path += rest[:accepted]
        return accepted == len(rest) and not self.matcher.is_terminated()

    def leave(self) -> None:
        if self.path:
            self.matcher.rollback(len(self.path))
            self.path = []
