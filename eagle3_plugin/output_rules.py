"""Sampling rules that read what a request has emitted (presence, frequency and repetition penalties,
``min_tokens``, allowed ids, bad words), applied at every node of a draft tree.

The target's logits at node ``n`` predict the token after the path root -> ``n``. Their rules see the request's
emitted tokens (the root, its last one, among them) followed by the path's draft tokens below the root, so each
node's logits are exactly those the engine would sample from had it emitted that path. Verification over them stays
lossless: greedy rows take their argmax, sampled rows the rejection rule with ``p`` from them.

The masks come first: ids outside ``allowed_token_ids``, then a grammar's (for drafting only: engines mask the
target's logits by their own grammar matchers), then bad words, then ``min_tokens`` (stop ids held back).
The ``logit_bias`` and the penalties follow in one of two engines' arithmetic (:attr:`OutputRules.arithmetic`):

- ``"vllm"`` (``Sampler.apply_logits_processors``: its ``LogitBiasLogitsProcessor``, then ``apply_penalties``): the
  bias, then repetition (for ids in the prompt or the context, a logit > 0 times ``1 / r``, else times ``r``), then
  frequency (minus ``f`` times the id's count in the context), then presence (minus ``p`` where it occurs);
- ``"sglang"`` (its penalizers summed as ``SamplingBatchInfo.update_penalties`` sums them, the form its speculative
  verification applies): ``x + -(F + P)``, ``F`` being ``f`` added once per occurrence in float32 (its frequency
  penalizer's running sum) and ``P`` ``p`` where the id occurs; then repetition, ``x * r`` where ``x < 0`` else
  ``x / r``, for ids in the output only (the prompt is not read); then the bias.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Protocol

import numpy as np
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


class PathGrammars(Protocol):
    """Some rows' grammars (``rows``), each as it stands after its row's emitted tokens (an engine's matchers).
    ``whole_tree``: the engine verifies every node of a tree under its grammar (SGLang), so every node's grammar is
    read while drafting; False: it verifies a row's leading path only (vLLM's chain of drafts), so only that path's
    is."""

    rows: list[int]
    whole_tree: bool

    def allowed_after(self, rows: list[int], paths: list[list[int]],
                      columns: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``[len(rows), C]`` bool: whether row ``rows[i]``'s grammar allows each id of ``columns [C]`` (default: all
        ``vocab_size``) after ``paths[i]`` (draft tokens below the root); all of them where it constrains nothing (it
        has ended) or the path already leaves it. Leaves the grammars as it found them."""


@dataclass
class OutputRules:
    """Per batch row ``b`` over a vocabulary of ``vocab_size`` ids. Rows without penalties have ``presence 0,
    frequency 0, repetition 1``.

    ``emitted``: each row's emitted tokens, read by the penalties and bad words (rows with neither may be empty).
    ``prompt [B, P]``: prompt ids padded with ``vocab_size``, for vLLM's repetition penalty (None: no row has
    penalties; SGLang's arithmetic ignores it). ``banned [B, V]``: True for ids the row may not emit (None: no row
    restricts them). ``arithmetic``: whose penalties, ``"vllm"`` or ``"sglang"`` (see the module's docstring).
    ``grammars``: rows' grammars an engine hands for drafting (:meth:`apply_at` reads them at ``grammar_at`` only;
    the engine masks the target's logits itself)."""

    vocab_size: int
    emitted: list[list[int]]
    prompt: Optional[torch.Tensor] = None
    presence: Optional[torch.Tensor] = None
    frequency: Optional[torch.Tensor] = None
    repetition: Optional[torch.Tensor] = None
    held_back: dict[int, HeldBack] = field(default_factory=dict)
    banned: Optional[torch.Tensor] = None
    bad_words: dict[int, list[list[int]]] = field(default_factory=dict)
    bias: Optional[torch.Tensor] = None  # [B, V] float, the rows' logit_bias; None: no row has one
    grammars: Optional[PathGrammars] = None
    arithmetic: str = "vllm"

    def __post_init__(self):
        if self.arithmetic not in _PENALTIES:
            raise ValueError(f"arithmetic must be one of {sorted(_PENALTIES)}, not {self.arithmetic!r}")

    @property
    def has_penalties(self) -> bool:
        return self.prompt is not None

    def apply(self, tree: DraftTree, logits: torch.Tensor) -> torch.Tensor:
        """``logits [B, N, V]`` float, node ``j`` of row ``b`` the target's after that node: each node's adjusted for
        its context, in place (returned)."""
        paths = tree.retrieve_indices()[:, :, 1:]  # [B, N, depth]: each node's path below the root
        tokens = torch.where(paths >= 0, tree.tokens.gather(1, paths.clamp(min=0).flatten(1)).view_as(paths), -1)
        return self.apply_at(tokens, tree.depths, logits)

    def apply_at(self, paths: torch.Tensor, depths: torch.Tensor, logits: torch.Tensor,
                 columns: Optional[torch.Tensor] = None, grammar_at: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``logits [B, K, C]`` float after ``K`` nodes per row whose paths below the root are ``paths [B, K, D]``
        (ids, -1 padded) at ``depths [B, K]``, adjusted in place (returned). ``columns [C]``: the id of each logit
        column (a draft's vocabulary within the target's; default all ``vocab_size``). ``grammar_at [B, K]`` bool:
        the nodes whose grammar is read (None: no grammar is read)."""
        if self.banned is not None:
            banned = self.banned if columns is None else self.banned[:, columns]
            logits.masked_fill_(banned[:, None, :], float("-inf"))
        if self.grammars is not None and grammar_at is not None:
            self._mask_by_grammars(paths, logits, columns, grammar_at)
        column_of = _column_index(columns, self.vocab_size) if (self.bad_words or self.held_back) else None
        for row, words in self.bad_words.items():
            for node in range(paths.shape[1]):
                context = self.emitted[row] + [t for t in paths[row, node].tolist() if t >= 0]
                logits[row, node, column_of(_completed_bad_words(words, context))] = float("-inf")
        for row, held in self.held_back.items():
            _hold_back(logits[row], depths[row] < held.remaining, column_of(held.stop_ids), held.restore)
        bias_first = self.bias is not None and self.arithmetic == "vllm"
        if bias_first:
            self._add_bias(logits, columns)
        if self.has_penalties:
            _penalise(logits, paths, self, columns)
        if self.bias is not None and not bias_first:
            self._add_bias(logits, columns)
        return logits

    def _mask_by_grammars(self, paths: torch.Tensor, logits: torch.Tensor, columns: Optional[torch.Tensor],
                          grammar_at: torch.Tensor) -> None:
        has_grammar = torch.zeros(grammar_at.shape[0], dtype=torch.bool, device=grammar_at.device)
        has_grammar[self.grammars.rows] = True
        at = torch.nonzero(grammar_at & has_grammar[:, None], as_tuple=True)
        if at[0].numel() == 0:
            return
        allowed = self.grammars.allowed_after(at[0].tolist(),
                                              [[t for t in path if t >= 0] for path in paths[at].tolist()], columns)
        forbidden = ~allowed.to(logits.device)
        if forbidden.shape[0] == logits.shape[0] * logits.shape[1]:  # every node, in row-major order: in place
            logits.masked_fill_(forbidden.view(logits.shape), float("-inf"))
        else:
            logits[at] = logits[at].masked_fill(forbidden, float("-inf"))

    def _add_bias(self, logits: torch.Tensor, columns: Optional[torch.Tensor]) -> None:
        logits += (self.bias if columns is None else self.bias[:, columns])[:, None, :]

    def for_draft(self) -> Optional["OutputRules"]:
        """The rules a draft obeys: those that remove ids (allowed ids, grammars, bad words, ``min_tokens``) and the
        bias, not the penalties; None if there are none. The penalties are in the target's logit units and read counts
        the draft's logits do not reflect (on the draft they moved acceptance both ways); a bias is a plain shift, and
        on the draft it raised acceptance (bundled checkpoint, SGLang, 12 prompts, greedy, fixed tree: -100 on 20 ids
        2.29 -> 2.56 tokens a round, +2 on 20 ids 3.20 -> 3.38)."""
        if self.banned is None and self.grammars is None and not self.bad_words and not self.held_back \
                and self.bias is None:
            return None
        return replace(self, prompt=None, presence=None, frequency=None, repetition=None)

    def followed_by(self, tokens: list[list[int]]) -> "OutputRules":
        """The rules once each row has also emitted ``tokens[b]`` (drafting after a step that emitted them)."""
        held = {row: HeldBack(h.remaining - len(tokens[row]), h.stop_ids, h.restore)
                for row, h in self.held_back.items() if h.remaining > len(tokens[row])}
        return replace(self, emitted=[e + t for e, t in zip(self.emitted, tokens)], held_back=held)


def drafting_rules(rules: Optional[OutputRules], grammars: Optional[PathGrammars], vocab_size: int,
                   emitted: list[list[int]]) -> Optional[OutputRules]:
    """The rules a step drafts under: ``rules`` (as of the next roots, each row having emitted ``emitted`` this step)
    with the rows' ``grammars`` (None: no row's)."""
    if grammars is None:
        return rules
    return replace(rules or OutputRules(vocab_size, emitted), grammars=grammars)


def _column_index(columns: Optional[torch.Tensor], vocab_size: int):
    """ids -> the logit columns that hold them (ids without a column dropped)."""
    if columns is None:
        return lambda ids: torch.tensor(ids, dtype=torch.long)
    where = _column_tensor(columns, vocab_size)

    def column_of(ids: list[int]) -> torch.Tensor:
        found = where[torch.tensor(ids, dtype=torch.long)]
        return found[found >= 0]
    return column_of


def _completed_bad_words(words: list[list[int]], context: list[int]) -> list[int]:
    """The last id of each bad word whose other ids end ``context`` (emitting it would complete the word)."""
    found = []
    for word in words:
        prefix = word[:-1]
        if len(prefix) <= len(context) and context[len(context) - len(prefix):] == prefix:
            found.append(word[-1])
    return found


def _hold_back(logits: torch.Tensor, shallow: torch.Tensor, stop_columns: torch.Tensor, restore: bool) -> None:
    """``logits [K, C]`` of one row: its stop ids' columns masked at the ``shallow [K]`` nodes (those with fewer than
    ``min_tokens`` emitted before them)."""
    nodes = torch.nonzero(shallow)[:, 0]
    if nodes.numel() == 0 or stop_columns.numel() == 0:
        return
    at = (nodes[:, None], stop_columns[None])
    before = logits[at]
    logits[at] = float("-inf")
    if restore:
        nothing_left = torch.isneginf(logits[nodes]).all(-1)
        logits[at] = torch.where(nothing_left[:, None], before, logits[at])


def _penalise(logits: torch.Tensor, paths: torch.Tensor, rules: OutputRules, columns: Optional[torch.Tensor]) -> None:
    """The penalties at every node of the rows that have them. Every logit is penalised for the row's emitted
    counts, then the ids on each node's path (at most its depth) again from the raw logit with their full count:
    memory of the logits' size, whatever the vocabulary (a dense count per node would be nodes x vocabulary)."""
    rows = torch.nonzero((rules.presence != 0) | (rules.frequency != 0) | (rules.repetition != 1))[:, 0]
    if rows.numel() == 0:
        return
    v = rules.vocab_size
    emitted = [rules.emitted[r] for r in rows.tolist()]
    width = max(1, max(len(e) for e in emitted))
    padded = torch.tensor([e + [v] * (width - len(e)) for e in emitted], dtype=torch.long)
    counts = torch.zeros(rows.numel(), v + 1, dtype=torch.long).scatter_add_(1, padded, torch.ones_like(padded))
    in_prompt = torch.zeros(rows.numel(), v + 1, dtype=torch.bool).scatter_(1, rules.prompt[rows], True)
    repetition, frequency, presence = (t[rows][:, None, None] for t in (rules.repetition, rules.frequency,
                                                                          rules.presence))
    x = logits[rows]  # [R, K, C]
    ids = paths[rows]  # [R, K, D]
    column = ids if columns is None else _column_tensor(columns, v)[ids.clamp(min=0)]
    on_path = (ids >= 0) & (column >= 0)
    column = column.clamp(min=0)
    raw = x.gather(2, column)
    by_column = (slice(None), slice(None, v)) if columns is None else (slice(None), columns)
    penalties = _PENALTIES[rules.arithmetic]
    penalties(x, counts[by_column][:, None, :], in_prompt[by_column][:, None, :], repetition, frequency, presence)
    path_ids = ids.clamp(min=0).flatten(1)
    repeats = ((ids[..., :, None] == ids[..., None, :]) & (ids >= 0)[..., None, :]).sum(-1)  # on the path itself
    full = counts.gather(1, path_ids).view_as(ids) + repeats
    again = penalties(raw, full, in_prompt.gather(1, path_ids).view_as(ids), repetition, frequency, presence)
    at = torch.nonzero(on_path, as_tuple=True)
    x[at[0], at[1], column[at]] = again[at]
    logits[rows] = x


def _vllm_penalties(x: torch.Tensor, counts: torch.Tensor, in_prompt: torch.Tensor, repetition: torch.Tensor,
                    frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """vLLM's ``apply_penalties`` on ``x`` in place (returned), for ids counted ``counts`` times in the context."""
    seen = counts > 0
    penalty = torch.where(in_prompt | seen, repetition, 1.0)
    x *= torch.where(x > 0, 1.0 / penalty, penalty)
    x -= frequency * counts
    x -= presence * seen
    return x


def _sglang_penalties(x: torch.Tensor, counts: torch.Tensor, in_prompt: torch.Tensor, repetition: torch.Tensor,
                      frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """SGLang's penalizers on ``x [R, K, C]`` in place (returned), for ids counted ``counts`` times in the output
    (``in_prompt`` unread: its repetition penalty reads the output only). ``-(F + P)`` equals SGLang's
    ``0 - F - P`` bit for bit, in either order (negation and float addition are exact under reordering here)."""
    seen = counts > 0
    x += -(_running_sums(frequency, counts) + torch.where(seen, presence, 0.0))
    scale = torch.where(seen, repetition, 1.0)
    x.copy_(torch.where(x < 0, x * scale, x / scale))
    return x


def _running_sums(step: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``[R, K, C]``: ``step [R, 1, 1]`` added to a float32 zero ``counts`` times, one add at a time (SGLang's
    frequency penalizer adds its penalty at each occurrence: ``n * f`` can differ from that in the last bit). The
    table of sums comes from numpy's float32 accumulate, which adds in order (``torch.cumsum`` does not)."""
    steps = step[:, 0, 0].float().cpu().numpy()
    most = int(counts.max()) if counts.numel() else 0
    table = np.zeros((steps.shape[0], most + 1), dtype=np.float32)
    table[:, 1:] = np.cumsum(np.repeat(steps[:, None], most, axis=1), axis=1, dtype=np.float32)
    table = torch.from_numpy(table).to(counts.device)  # [R, max count + 1]
    return table[:, None, :].expand(-1, counts.shape[1], -1).gather(2, counts)


_PENALTIES = {"vllm": _vllm_penalties, "sglang": _sglang_penalties}


def _column_tensor(columns: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[vocab_size]``: each id's logit column, -1 for ids without one."""
    where = torch.full((vocab_size,), -1, dtype=torch.long)
    where[columns] = torch.arange(columns.numel())
    return where
