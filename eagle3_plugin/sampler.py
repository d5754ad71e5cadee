"""Strict verification of a draft tree against the target: pure tensor functions, no engine state.

Every engine integration, the reference generator and the statistical tests call :func:`verify_tree`.

- Greedy rows (temperature 0): accept the child equal to the target's argmax, level by level; the bonus
  token is the argmax after the path. Output equals non-speculative greedy decoding.
- ``method="real"`` (T > 0): recursive rejection sampling with the draft's real probabilities. A node's
  children were drawn without replacement from ``q``; child ``x`` is accepted with ``min(1, p(x)/q(x))``;
  on rejection ``p <- norm(max(p - q, 0))`` and ``q <- norm(q with x removed)``; if every child is
  rejected the bonus is drawn from the residual ``p``. A chain is the one-child case: ``min(1, p/q)``
  plus the residual, the classic speculative sampling rule.
- ``method="one_hot"`` (T > 0): the draft treated as deterministic, as EAGLE and SGLang do: accept ``x``
  with ``p(x)``, else ``p <- norm(p with x removed)``. Lossless for any tree, lower acceptance.

``p`` is the target distribution after temperature, min-p, top-k and top-p, the way the serving engine filters
(:data:`FilterOrder`). Min-p drops ids whose probability is below ``min_p`` times the most likely id's. vLLM and HF
transformers apply top-p to what top-k kept, renormalised ("sequential"); vLLM's min-p comes first, on the
temperature-scaled distribution (its ``MinPLogitsProcessor``). SGLang applies top-k and top-p to the
temperature-scaled distribution at once ("joint", its torch and flashinfer samplers), then min-p. Lossless means the
engine's own law, so each engine's shim names its order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import torch

from .rng import as_row_random
from .tree import DraftTree

Method = Literal["real", "one_hot"]
FilterOrder = Literal["sequential", "joint"]


@dataclass
class SamplingParams:
    """Per-row sampling settings: ``temperature [B]`` (0 = greedy), ``top_k [B]`` (0 = off), ``top_p [B]``; the
    engine's ``filter_order`` (see the module docstring); ``min_p [B]`` (0 = off; None: off in every row)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    filter_order: FilterOrder = "sequential"
    min_p: Optional[torch.Tensor] = None

    def __post_init__(self):
        if self.filter_order not in ("sequential", "joint"):
            raise ValueError(f"unknown top-k/top-p filter order {self.filter_order!r}")

    @classmethod
    def uniform(cls, batch: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                device=None, filter_order: FilterOrder = "sequential", min_p: float = 0.0) -> "SamplingParams":
        return cls(torch.full((batch,), float(temperature), device=device),
                   torch.full((batch,), int(top_k), dtype=torch.long, device=device),
                   torch.full((batch,), float(top_p), device=device), filter_order,
                   torch.full((batch,), float(min_p), device=device) if min_p else None)

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature <= 0

    def select(self, rows: torch.Tensor) -> "SamplingParams":
        return SamplingParams(self.temperature[rows], self.top_k[rows], self.top_p[rows], self.filter_order,
                              None if self.min_p is None else self.min_p[rows])


@dataclass
class Verdict:
    """``accepted [B, depth + 1]``: node indices of the accepted path, root first, padded with -1;
    ``num_accepted [B]``: accepted draft tokens; ``bonus [B]``: the target token after the path."""

    accepted: torch.Tensor
    num_accepted: torch.Tensor
    bonus: torch.Tensor

    def select(self, rows: torch.Tensor) -> "Verdict":
        return Verdict(self.accepted[rows], self.num_accepted[rows], self.bonus[rows])

    def emitted(self, tree: DraftTree) -> torch.Tensor:
        """``[B, depth + 1]``: per row, the tokens this round emits (accepted draft tokens, then the bonus), -1 padded.
        Token ``j`` is the one after accepted node ``accepted[:, j]``."""
        tokens = tree.tokens.gather(1, self.accepted[:, 1:].clamp(min=0))
        tokens = torch.cat([tokens, self.bonus[:, None]], dim=1)
        tokens.scatter_(1, self.num_accepted[:, None], self.bonus[:, None])
        width = torch.arange(tokens.shape[1], device=tokens.device)
        return torch.where(width[None] <= self.num_accepted[:, None], tokens, -1)

    def output_tokens(self, tree: DraftTree) -> list[list[int]]:
        """Per row, the tokens this round emits: accepted draft tokens then the bonus token."""
        return [[t for t in row if t >= 0] for row in self.emitted(tree).tolist()]


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``logits [B, ..., V]`` -> probabilities; greedy rows become one-hot at the argmax."""
    shape = (logits.shape[0],) + (1,) * (logits.dim() - 1)
    logits = logits.float()
    t = torch.where(params.greedy, torch.ones_like(params.temperature), params.temperature).view(shape)
    scaled = logits / t
    if params.filter_order == "joint":
        probs = _joint_top_k_top_p(torch.softmax(scaled, dim=-1), params, shape)
    else:
        probs = _sequential_top_k_top_p(scaled, params, shape)
    one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.where(params.greedy.view(shape), one_hot, probs)


def _sequential_top_k_top_p(scaled: torch.Tensor, params: SamplingParams, shape: tuple) -> torch.Tensor:
    """vLLM's and HF's order: min-p on the scaled distribution (vLLM's), top-k on the scaled logits (ties at the k-th
    value all stay), softmax, then the shortest prefix by probability whose mass reaches top_p (ties: the lower id
    first)."""
    if params.min_p is not None and bool((params.min_p > 0).any()):
        probs = torch.softmax(scaled, dim=-1)
        floor = probs.amax(-1, keepdim=True) * params.min_p.view(shape)
        scaled = scaled.masked_fill(probs < floor, float("-inf"))
    if bool((params.top_k > 0).any()):
        k = _top_k_counts(params, scaled.shape[-1], shape)
        kth = torch.gather(torch.sort(scaled, dim=-1, descending=True).values, -1,
                           (k - 1).expand(*scaled.shape[:-1], 1))
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if bool((params.top_p < 1).any()):
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # ties: the lower id first
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p.view(shape)  # mass before it reaches top_p
        probs = _without_sorted(probs, order, drop_sorted)
    return probs


def _joint_top_k_top_p(probs: torch.Tensor, params: SamplingParams, shape: tuple) -> torch.Tensor:
    """SGLang's order (``top_k_top_p_min_p_sampling_from_probs_torch``): by rank in the scaled distribution, a token
    stays if it is among the top_k, the mass ranked above it is at most top_p, and its probability is at least min_p
    times the first's; then renormalise. Ties rank the lower id first (SGLang's sort leaves their order open)."""
    min_p = params.min_p if params.min_p is not None and bool((params.min_p > 0).any()) else None
    if min_p is None and not bool(((params.top_k > 0) | (params.top_p < 1)).any()):
        return probs
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    rank = torch.arange(probs.shape[-1], device=probs.device)
    drop_sorted = ((rank >= _top_k_counts(params, probs.shape[-1], shape))
                   | ((sorted_p.cumsum(-1) - sorted_p) > params.top_p.view(shape)))
    if min_p is not None:
        drop_sorted |= sorted_p < sorted_p[..., :1] * min_p.view(shape)
    return _without_sorted(probs, order, drop_sorted)


def _top_k_counts(params: SamplingParams, v: int, shape: tuple) -> torch.Tensor:
    """Each row's top-k as a count of tokens (off: all ``v``), shaped ``shape`` to broadcast over ``[B, ..., V]``."""
    return torch.where(params.top_k > 0, params.top_k.clamp(max=v), torch.full_like(params.top_k, v)).view(shape)


def _without_sorted(probs: torch.Tensor, order: torch.Tensor, drop_sorted: torch.Tensor) -> torch.Tensor:
    """``probs`` renormalised without the tokens ``drop_sorted`` marks, in the sorted ``order``."""
    probs = probs.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), 0.0)
    return probs / probs.sum(-1, keepdim=True)


def sample_tokens(logits: torch.Tensor, params: SamplingParams, generator=None) -> torch.Tensor:
    """One token per row of ``logits [B, V]``, from the target distribution (argmax for greedy rows).
    ``generator``: a :class:`~eagle3_plugin.rng.RowRandom`, a ``torch.Generator`` or None."""
    probs = target_probs(logits, params)
    if bool(params.greedy.all()):
        return probs.argmax(-1)
    return torch.where(params.greedy, probs.argmax(-1), as_row_random(generator).categorical(probs))


def verify_tree(tree: DraftTree, target_logits: torch.Tensor, params: SamplingParams, method: Method = "real",
                generator: Optional[torch.Generator] = None) -> Verdict:
    """Accept a root-to-node path of ``tree`` and draw the bonus token (see the module docstring).

    ``target_logits [B, N, V]``: the target's logits after each node of the tree (rows of detached nodes, see
    :meth:`DraftTree.truncated`, are never read). ``generator``: a :class:`~eagle3_plugin.rng.RowRandom`
    (seeded rows draw from their own generator), a ``torch.Generator`` or None.
    """
    _check_method(method)
    if bool(params.greedy.all()):
        return verify_greedy(tree, target_logits)
    return verify_tree_general(tree, target_logits, params, method, generator)


def verify_tree_rows(tree: DraftTree, logits: torch.Tensor, rows: torch.Tensor, params: SamplingParams,
                     method: Method = "real", generator: Optional[torch.Generator] = None) -> Verdict:
    """:func:`verify_tree` over an engine's flat logits ``[T, V]``: node ``j`` of row ``b`` reads
    ``logits[rows[b, j]]``. An all-greedy batch takes the argmax of the flat rows, then the tree's (the tree's rows
    are not copied out)."""
    _check_method(method)
    if bool(params.greedy.all()):
        return greedy_verdict(tree, logits.argmax(-1)[rows])
    return verify_tree_general(tree, logits[rows].float(), params, method, generator)


def verify_tree_general(tree: DraftTree, target_logits: torch.Tensor, params: SamplingParams, method: Method = "real",
                        generator: Optional[torch.Generator] = None) -> Verdict:
    """:func:`verify_tree` for any mix of greedy and sampled rows (greedy ones see a one-hot ``p``)."""
    _check_method(method)
    random = as_row_random(generator)
    b, n = tree.tokens.shape
    device = tree.tokens.device
    rows = torch.arange(b, device=device)
    use_real = ~params.greedy & (method == "real")
    if tree.draft_probs is None:
        if bool((use_real[:, None] & (tree.parents >= 0)).any()):
            raise ValueError("method='real' needs a tree built with sample=True (it carries the draft probabilities)")
        use_real = torch.zeros_like(use_real)  # root-only rows: nothing to verify, the bonus comes from p
    p_all = target_probs(target_logits, params)
    children = tree.children(tree.max_children())
    depth = int(tree.depths.max())

    cur = torch.zeros(b, dtype=torch.long, device=device)
    p_cur = p_all[:, 0]
    q_cur = _draft_probs_at(tree, rows, cur, p_cur) if bool(use_real.any()) else None
    active = torch.ones(b, dtype=torch.bool, device=device)
    accepted = torch.full((b, depth + 1), -1, dtype=torch.long, device=device)
    accepted[:, 0] = 0
    for level in range(depth):
        moved = torch.zeros(b, dtype=torch.bool, device=device)
        for j in range(children.shape[2]):
            child = children[rows, cur, j]
            trying = active & ~moved & (child >= 0)
            if not bool(trying.any()):
                break
            x = tree.tokens[rows, child.clamp(min=0)]
            px = p_cur[rows, x]
            ratio = px
            if q_cur is not None:
                ratio = torch.where(use_real, px / q_cur[rows, x].clamp(min=1e-30), px)
            accept = trying & (random.uniform((b,), device, drawing=trying) < ratio)
            reject = trying & ~accept
            if q_cur is not None:
                real_reject = (reject & use_real)[:, None]
                residual = _normalize((p_cur - q_cur).clamp(min=0), fallback=p_cur)
                q_without_x = _normalize(q_cur.scatter(1, x[:, None], 0.0), fallback=q_cur)
                p_cur = torch.where(real_reject, residual, p_cur)
                q_cur = torch.where(real_reject, q_without_x, q_cur)
            onehot_reject = (reject & ~use_real)[:, None]
            p_cur = torch.where(onehot_reject, _normalize(p_cur.scatter(1, x[:, None], 0.0), fallback=p_cur), p_cur)
            cur = torch.where(accept, child, cur)
            moved |= accept
        accepted[:, level + 1] = torch.where(moved, cur, accepted[:, level + 1])
        p_cur = torch.where(moved[:, None], p_all[rows, cur], p_cur)
        if q_cur is not None:
            q_cur = torch.where(moved[:, None], _draft_probs_at(tree, rows, cur, p_cur), q_cur)
        active &= moved
        if not bool(active.any()):
            break
    bonus = torch.where(params.greedy, p_cur.argmax(-1), random.categorical(p_cur))
    return Verdict(accepted=accepted, num_accepted=(accepted[:, 1:] >= 0).sum(1), bonus=bonus)


def unscored_to_bonus(verdict: Verdict, tree: DraftTree, scored: torch.Tensor) -> Verdict:
    """``verdict`` over ``tree`` whose nodes from ``scored [B]`` on are leaves without target logits of their own (an
    engine ran the target on fewer nodes than were proposed; their logits rows may hold anything): an accepted one
    becomes the bonus token, and the accepted path ends at its parent. Lossless: such a node was verified as its
    parent's child like any other, which reads the parent's logits only, and the bonus after it, which would read its
    own, is left to the engine's next step. Engines whose verified nodes depend on the draft's tokens need this: vLLM
    cuts a chain before its first draft token a grammar forbids, and a bonus drawn from ``p`` at the cut, where the
    cut child's rejection would have drawn it from the residual, leaves the target's law."""
    rows = torch.arange(tree.tokens.shape[0], device=tree.tokens.device)
    deepest = verdict.accepted[rows, verdict.num_accepted]
    unscored = deepest >= scored
    accepted = verdict.accepted.clone()
    accepted[rows[unscored], verdict.num_accepted[unscored]] = -1
    return Verdict(accepted, verdict.num_accepted - unscored.long(),
                   torch.where(unscored, tree.tokens[rows, deepest], verdict.bonus))


def _check_method(method: str) -> None:
    if method not in ("real", "one_hot"):
        raise ValueError(f"unknown verification method {method!r}")


def verify_greedy(tree: DraftTree, target_logits: torch.Tensor) -> Verdict:
    """:func:`verify_tree` when every row is greedy, without probabilities: a node is accepted when it and each of
    its ancestors carries the target's argmax after its parent; siblings carry distinct tokens, so the accepted
    nodes form one path, and its deepest node gives the bonus token. Same verdict as the general path (whose
    one-hot ``p`` accepts exactly those children), a few batched ops instead of a loop over vocabulary rows."""
    return greedy_verdict(tree, target_logits.argmax(-1))


def greedy_verdict(tree: DraftTree, best: torch.Tensor) -> Verdict:
    """:func:`verify_greedy` given the target's argmax after each node, ``best [B, N]`` (engines take it from their
    flat logits without copying the tree's rows out)."""
    b, device = tree.tokens.shape[0], tree.tokens.device
    rows = torch.arange(b, device=device)
    parent = tree.parents.clamp(min=0)
    match = (tree.tokens == best.gather(1, parent)) & (tree.parents >= 0)
    match[:, 0] = True
    width = int(tree.depths.max()) + 1
    on_path = match
    for _ in range(width - 1):  # after d rounds a node is on the path if it and its d nearest ancestors match
        on_path = match & on_path.gather(1, parent)
    end = torch.where(on_path, tree.depths, -1).argmax(1)
    at_depth = on_path[:, None, :] & (tree.depths[:, None, :] == torch.arange(width, device=device)[None, :, None])
    accepted = torch.where(at_depth.any(2), at_depth.float().argmax(2), -1)  # one on-path node per depth
    return Verdict(accepted=accepted, num_accepted=tree.depths[rows, end], bonus=best[rows, end])


def _draft_probs_at(tree: DraftTree, rows: torch.Tensor, node: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The draft distribution at ``node`` per row, scattered into the target vocabulary."""
    q = torch.zeros_like(like)
    return q.index_copy_(1, tree.hot_ids, tree.draft_probs[rows, node].to(like.dtype))


def _normalize(x: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = x.sum(-1, keepdim=True)
    return torch.where(total > 0, x / total.clamp(min=1e-30), fallback)
