"""EAGLE-2 dynamic draft tree, batched: expansion by cumulative score, rerank, masks, paths.

Definitions (see also :mod:`eagle3_plugin.config`): ``depth`` draft levels; at each level the
``top_k`` best frontier nodes are expanded into ``top_k`` children each; finally the best
``total_tokens - 1`` of all candidates are kept under the root. A chain is ``top_k = 1``.

Scores. Greedy and one-hot trees rank by the cumulative draft log-probability. Trees for real-probability
sampling draw each node's children *without replacement* from the draft (Gumbel-top-k) and rank by
truncated-Gumbel scores (Kool et al. 2019), which never increase down a path and keep the sampling
order among siblings. Either way a child never outranks its parent (ties go to the earlier candidate),
so the kept set is closed under ancestors, and in creation order siblings appear in sampling order:
the recursive rejection sampler relies on both.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from .rng import RowRandom, as_row_random

# expand(level, tokens [B, k], parent_slot [B, k]) -> draft logits [B, k, draft_vocab]
ExpandFn = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class DraftTree:
    """One draft tree per row, ``N = total_tokens`` nodes in topological order, the root at index 0.

    ``tokens [B, N]`` target-vocabulary ids (root: the last token, not yet verified), ``parents [B, N]``
    (-1 for the root, else a smaller index), ``depths [B, N]`` (root 0). For real-probability trees,
    ``draft_probs [B, N, draft_vocab]`` is the distribution node i's children were drawn from, and
    ``hot_ids [draft_vocab]`` maps draft ids to target ids.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    draft_probs: Optional[torch.Tensor] = None
    hot_ids: Optional[torch.Tensor] = None

    @classmethod
    def root_only(cls, roots: torch.Tensor) -> "DraftTree":
        """``roots [B]`` as trees of one node each: verifying one is a plain decode step."""
        tokens = roots.long()[:, None]
        zeros = torch.zeros_like(tokens)
        return cls(tokens, zeros - 1, zeros)

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def prefix(self, n: int) -> "DraftTree":
        """The first ``n`` nodes: still a tree, since parents precede children (an engine may verify fewer
        nodes than were proposed, e.g. near a length limit)."""
        probs = None if self.draft_probs is None else self.draft_probs[:, :n]
        return DraftTree(self.tokens[:, :n], self.parents[:, :n], self.depths[:, :n], probs, self.hot_ids)

    def paths(self, counts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``[B]`` bool: whether each row's nodes (its first ``counts[b]``; all by default) form one path from the
        root, node ``i`` at depth ``i``: a chain, which an engine verifies as one (causal attention, positions in
        order, an accepted path already in place)."""
        nodes = torch.arange(self.size, device=self.depths.device)
        off_path = self.depths != nodes
        if counts is not None:
            off_path &= nodes[None] < counts[:, None]
        return ~off_path.any(1)

    def ancestor_mask(self) -> torch.Tensor:
        """``[B, N, N]`` bool: node j is node i or one of its ancestors (the tree attention mask); computed once."""
        if self.__dict__.get("_ancestors") is None:
            self.__dict__["_ancestors"] = self._ancestor_mask()
        return self.__dict__["_ancestors"]

    def _ancestor_mask(self) -> torch.Tensor:
        b, n = self.parents.shape
        eye = torch.eye(n, dtype=torch.bool, device=self.parents.device).expand(b, n, n)
        mask, up, has_parent = eye, self.parents.clamp(min=0)[..., None].expand(b, n, n), (self.parents >= 0)[..., None]
        for _ in range(int(self.depths.max())):  # after d rounds every node sees its ancestors up to d levels up
            mask = eye | (torch.gather(mask, 1, up) & has_parent)
        return mask

    def max_children(self) -> int:
        """The largest number of children of any node (at least 1)."""
        is_child = (self.parents >= 0).long()
        counts = torch.zeros_like(self.parents).scatter_add_(1, self.parents.clamp(min=0), is_child)
        return max(int(counts.max()), 1)

    def children(self, max_children: int) -> torch.Tensor:
        """``[B, N, max_children]``: each node's children in index order, padded with -1."""
        b, n = self.parents.shape
        nodes = torch.arange(n, device=self.parents.device)
        is_child = self.parents[:, None, :] == nodes[None, :, None]  # [B, parent, child]
        order = torch.sort((~is_child).to(torch.int8), dim=2, stable=True).indices[..., :max_children]
        return torch.where(torch.gather(is_child, 2, order), order, torch.full_like(order, -1))

    def leading_paths(self, rows: torch.Tensor) -> tuple["DraftTree", torch.Tensor]:
        """The same trees, with the rows ``rows [B]`` (bool) cut to their leading path, root first: each node's first
        child (in index order, that is in sampling order: the draft's most likely id for greedy trees, its first draw
        without replacement for sampled ones, a plain draw from ``q``), to the first node without children; the other
        nodes detached. So such a row is a chain of plain draws, verified losslessly as one, for engines that can
        verify only a chain for some requests (vLLM's grammars). Returns the trees and each row's node count (``size``
        for the other rows)."""
        b, n = self.parents.shape
        device = self.parents.device
        first = self.children(1)[..., 0]  # [B, N]: each node's first child, -1 if none
        node, path = torch.zeros(b, dtype=torch.long, device=device), []
        for _ in range(n):
            path.append(node)
            node = torch.where(node >= 0, first.gather(1, node.clamp(min=0)[:, None])[:, 0], -1)
        path = torch.stack(path, dim=1)  # [B, N]: the leading path's nodes, then -1
        on_path = path >= 0
        index = torch.arange(n, device=device).expand(b, n)
        at = path.clamp(min=0)
        tokens = torch.where(on_path, self.tokens.gather(1, at), 0)
        parents = torch.where(on_path, index - 1, -1)
        depths = torch.where(on_path, index, 0)
        pick = rows[:, None]
        probs = self.draft_probs
        if probs is not None:
            chained = torch.where(on_path[..., None], probs.gather(1, at[..., None].expand(-1, -1, probs.shape[2])),
                                  0.0)
            probs = torch.where(pick[..., None], chained, probs)
        trees = DraftTree(torch.where(pick, tokens, self.tokens), torch.where(pick, parents, self.parents),
                          torch.where(pick, depths, self.depths), probs, self.hot_ids)
        return trees, torch.where(rows, on_path.sum(1), n)

    def retrieve_indices(self) -> torch.Tensor:
        """``[B, N, depth + 1]``: for each node, its root-to-node path (padded with -1); leaves' rows
        are EAGLE's retrieve indices."""
        b, n = self.parents.shape
        width = int(self.depths.max()) + 1
        device = self.parents.device
        paths = torch.full((b, n, width + 1), -1, dtype=torch.long, device=device)  # last column: discard
        node, depth = torch.arange(n, device=device).expand(b, n), self.depths
        for _ in range(width):  # walk every node up to the root, writing each ancestor at its depth
            alive = node >= 0
            paths.scatter_(2, torch.where(alive, depth, width)[..., None], node[..., None])
            node = torch.where(alive & (depth > 0), self.parents.gather(1, node.clamp(min=0)), -1)
            depth = depth - 1
        return paths[..., :width]

    def truncated(self, counts: torch.Tensor) -> "DraftTree":
        """Row ``b`` keeps its first ``counts[b]`` nodes (still a tree, since parents precede children); later
        nodes are detached (parent -1, depth 0): no verification reaches them. For engines that verify fewer
        nodes than were proposed (length limits, token budgets)."""
        kept = torch.arange(self.size, device=counts.device)[None] < counts[:, None]
        kept[:, 0] = True
        return DraftTree(self.tokens, torch.where(kept, self.parents, -1), torch.where(kept, self.depths, 0),
                         self.draft_probs, self.hot_ids)

    def padded(self, n: int) -> "DraftTree":
        """The same trees with ``n`` nodes: the added ones detached (parent -1, depth 0, no children)."""
        extra = n - self.size
        if extra <= 0:
            return self
        b, device = self.tokens.shape[0], self.tokens.device
        zeros = torch.zeros(b, extra, dtype=torch.long, device=device)
        probs = None if self.draft_probs is None else torch.cat(
            [self.draft_probs, self.draft_probs.new_zeros(b, extra, self.draft_probs.shape[2])], dim=1)
        return DraftTree(torch.cat([self.tokens, zeros], 1), torch.cat([self.parents, zeros - 1], 1),
                         torch.cat([self.depths, zeros], 1), probs, self.hot_ids)

    @staticmethod
    def stack(trees: list["DraftTree"]) -> "DraftTree":
        """Trees of one size, row batches concatenated. A batch drafted without sampling rows carries no draft
        probabilities; beside batches that do, its rows (greedy ones) get zeros, which no verification reads."""
        with_probs = [t for t in trees if t.draft_probs is not None]
        probs = None
        if with_probs:
            like = with_probs[0].draft_probs
            probs = torch.cat([t.draft_probs if t.draft_probs is not None else
                               like.new_zeros(t.tokens.shape[0], *like.shape[1:]) for t in trees])
        return DraftTree(*(torch.cat([getattr(t, name) for t in trees]) for name in ("tokens", "parents", "depths")),
                         probs, with_probs[0].hot_ids if with_probs else trees[0].hot_ids)

    def select(self, rows: torch.Tensor) -> "DraftTree":
        """The trees of ``rows``."""
        probs = None if self.draft_probs is None else self.draft_probs[rows]
        return DraftTree(self.tokens[rows], self.parents[rows], self.depths[rows], probs, self.hot_ids)


def build_tree(root_tokens: torch.Tensor, root_logits: torch.Tensor, expand: ExpandFn, depth: int, top_k: int,
               total_tokens: int, temperature: torch.Tensor, sample: bool, hot_ids: torch.Tensor,
               generator: Union[RowRandom, torch.Generator, None] = None) -> DraftTree:
    """Grow one tree per row.

    ``root_logits [B, Vd]`` are the draft's logits for the first level; ``expand`` runs the draft on a
    level's frontier. ``temperature [B]`` (0 = greedy) scales the draft distribution; with ``sample``,
    rows with temperature > 0 draw children without replacement (and keep ``draft_probs``).
    """
    b, vd = root_logits.shape
    device = root_logits.device
    random = as_row_random(generator)
    rows = torch.arange(b, device=device)
    t_eff = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).to(root_logits.dtype)
    sampled_rows = (temperature > 0) & sample
    sample, scaled = _any_row(sampled_rows, temperature > 0)  # no row samples: cumulative log-probabilities only

    index = _tree_index(depth, top_k, device)
    cand_tokens, cand_score = [], []  # per level, its candidates: k_prev * top_k, parent-major
    fronts = []  # per level but the last, the candidate index of each frontier node, in slot order
    expanded_probs = []  # per expanded node (root first), the draft distribution over its children
    # Frontier state: cumulative log-prob phi, perturbed score g (sampled trees), their candidate indices.
    phi = torch.zeros(b, 1, device=device)
    g = torch.zeros(b, 1, device=device)
    logits = root_logits[:, None, :]
    n_cand = 0
    for level in range(1, depth + 1):
        logq = torch.log_softmax(logits.float() / t_eff[:, None, None] if scaled else logits.float(), dim=-1)
        if sample:
            child_phi = phi[..., None] + logq  # [B, k_prev, Vd]
            expanded_probs.append(logq.exp())
            perturbed = child_phi + _gumbel(child_phi.shape, random, device) * sampled_rows[:, None, None]
            top_perturbed, top_ids = _stable_topk(perturbed, top_k)  # [B, k_prev, k]
            top_phi = torch.gather(child_phi, 2, top_ids)
            top_g = _truncated_gumbel(g[..., None], top_perturbed, perturbed.amax(-1, keepdim=True))
            score = torch.where(sampled_rows[:, None, None], top_g, top_phi).flatten(1)  # [B, k_prev * k]
        else:
            top_phi, top_ids = _stable_topk(logq, top_k, offset=phi[..., None])  # of phi + logq, [B, k_prev, k]
            score = top_phi.flatten(1)
        k_prev = logits.shape[1]
        cand_tokens.append(hot_ids[top_ids.flatten(1)])
        cand_score.append(score)
        if level == depth:
            break
        # Next frontier: the level's top_k candidates by score. At level 1 that is all of them, already in score
        # order (a stable top-k) unless sampled scores reorder them.
        if level == 1 and not sample:
            front_cand, front_tokens = index.first_front.expand(b, -1), cand_tokens[-1]
            parent_slot = torch.zeros_like(front_cand)
            phi = score
        else:
            order = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :top_k]
            front_cand, front_tokens = n_cand + order, torch.gather(cand_tokens[-1], 1, order)
            parent_slot = order // top_k
            phi = torch.gather(top_phi.flatten(1), 1, order)
            if sample:
                g = torch.gather(score, 1, order)
        fronts.append(front_cand)
        logits = expand(level, front_tokens, parent_slot)
        n_cand += k_prev * top_k

    tokens, score = torch.cat(cand_tokens, dim=1), torch.cat(cand_score, dim=1)
    fronts = torch.cat(fronts, dim=1) if fronts else torch.zeros(b, 0, dtype=torch.long, device=device)
    parent = torch.cat([index.root_children.expand(b, -1), fronts.gather(1, index.parent_front.expand(b, -1))], 1)
    keep = torch.sort(torch.sort(score, dim=1, descending=True, stable=True).indices[:, :total_tokens - 1],
                      dim=1).values  # creation order: topological, siblings in sampling order
    node_of_cand = torch.full_like(parent, -1)
    node_of_cand[rows[:, None], keep] = torch.arange(1, total_tokens, device=device)
    kept_parent = torch.gather(parent, 1, keep)
    parent_node = torch.where(kept_parent < 0, torch.zeros_like(kept_parent),
                              torch.gather(node_of_cand, 1, kept_parent.clamp(min=0)))
    tree = DraftTree(
        tokens=torch.cat([root_tokens[:, None], torch.gather(tokens, 1, keep)], dim=1),
        parents=torch.cat([torch.full((b, 1), -1, dtype=torch.long, device=device), parent_node], dim=1),
        depths=torch.cat([torch.zeros(b, 1, dtype=torch.long, device=device),
                          index.depths.expand(b, -1).gather(1, keep)], 1),
    )
    if not bool((tree.parents[:, 1:] >= 0).all()):
        raise RuntimeError("draft tree: a kept node's parent was dropped (ancestor closure broken)")
    if sample:
        probs = torch.cat(expanded_probs, dim=1)  # [B, E, Vd]
        slot = torch.full_like(parent, -1).scatter_(1, fronts, index.front_slots.expand(b, -1))
        node_slot = torch.cat([torch.zeros(b, 1, dtype=torch.long, device=device), torch.gather(slot, 1, keep)], 1)
        tree.draft_probs = torch.gather(probs, 1, node_slot.clamp(min=0)[..., None].expand(-1, -1, vd))
        tree.draft_probs[node_slot < 0] = 0.0  # never expanded: no children
        tree.hot_ids = hot_ids
    return tree


@dataclass(frozen=True)
class _TreeIndex:
    """What every tree of one ``(depth, top_k)`` shares, by candidate (level by level, parent-major: level 1's
    ``top_k``, then ``top_k * top_k`` per level): ``depths``, ``[1, C]``; ``root_children``, ``[1, top_k]`` of -1
    (level 1's parent is the root); ``parent_front``, ``[1, C - top_k]``: for each later candidate, its parent's
    index among the frontier nodes of all levels (``top_k`` per level); ``front_slots``, ``[1, F]``: each frontier
    node's slot among expanded nodes (the root is slot 0); ``first_front``, ``[1, top_k]``: level 1's frontier
    (all its candidates, in order)."""

    depths: torch.Tensor
    root_children: torch.Tensor
    parent_front: torch.Tensor
    front_slots: torch.Tensor
    first_front: torch.Tensor


@functools.lru_cache(maxsize=64)
def _tree_index(depth: int, top_k: int, device: torch.device) -> _TreeIndex:
    per_level = [top_k] + [top_k * top_k] * (depth - 1)
    depths = torch.repeat_interleave(torch.arange(1, depth + 1), torch.tensor(per_level))
    parent_front = torch.arange((depth - 1) * top_k).repeat_interleave(top_k)
    fronts = (depth - 1) * top_k
    return _TreeIndex(*(t[None].to(device) for t in (depths, torch.full((top_k,), -1), parent_front,
                                                      torch.arange(1, fronts + 1), torch.arange(top_k))))


def build_chain(root_tokens: torch.Tensor, root_logits: torch.Tensor, expand: ExpandFn, depth: int,
                temperature: torch.Tensor, sample: bool, hot_ids: torch.Tensor,
                generator: Union[RowRandom, torch.Generator, None] = None) -> DraftTree:
    """:func:`build_tree` with ``top_k = 1`` (``total_tokens = depth + 1``), without a tree's bookkeeping: each level
    takes the draft's argmax, or, for rows that sample, the Gumbel-max of the same noise :func:`build_tree` draws,
    so both give the same chain (tested)."""
    b, vd = root_logits.shape
    device = root_logits.device
    random = as_row_random(generator)
    sampled_rows = (temperature > 0) & sample
    sample, scaled = _any_row(sampled_rows, temperature > 0)
    t_eff = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).to(root_logits.dtype)
    tokens, probs, logits = [root_tokens], [], root_logits
    parent_slot = torch.zeros(b, 1, dtype=torch.long, device=device)
    for level in range(1, depth + 1):
        if sample:
            logq = torch.log_softmax(logits.float() / t_eff[:, None] if scaled else logits.float(), dim=-1)
            probs.append(logq.exp())
            noise = _gumbel((b, 1, vd), random, device)[:, 0] * sampled_rows[:, None]
            ids = (logq + noise).argmax(-1)
        else:
            ids = logits.argmax(-1)
        tokens.append(hot_ids[ids])
        if level < depth:
            logits = expand(level, tokens[-1][:, None], parent_slot)[:, 0]
    nodes = torch.arange(depth + 1, device=device).expand(b, -1)
    tree = DraftTree(torch.stack(tokens, dim=1), nodes - 1, nodes.clone())
    if sample:
        tree.draft_probs = torch.stack(probs + [torch.zeros_like(probs[0])], dim=1)
        tree.hot_ids = hot_ids
    return tree


def _stable_topk(x: torch.Tensor, k: int, offset: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of ``x + offset`` (``offset`` broadcast along the last dim, e.g. each parent's score; none: of ``x``)
    along the last dim, ties broken by the lower index (torch.topk does not promise it).

    On a CPU, a fast path: ``torch.topk`` of ``k + 1`` of ``x``, then the offset added to those values alone (adding
    a constant keeps the order, and rounding can only make equal values): when the k-th is above the (k+1)-th,
    nothing outside them can reach the top k, and ties among them (rounding makes some at most levels of a batch's
    trees) are ordered by index there. Else the full stable sort of ``x + offset`` decides. That check reads the
    device; on a GPU, where a host read stalls the queue, :func:`_keyed_topk`.
    """
    if x.is_cuda and x.dtype == torch.float32:
        return _keyed_topk(x if offset is None else offset + x, k)
    if k < x.shape[-1]:
        values, ids = torch.topk(x, k + 1, dim=-1)
        if offset is not None:
            values = offset + values
        falls = values[..., 1:] < values[..., :-1]
        if bool(falls.all()):
            return values[..., :k], ids[..., :k]
        if bool(falls[..., k - 1].all()):  # ties inside the top k only: by value, then by the lower index
            by_index = ids.argsort(dim=-1)
            values, ids = values.gather(-1, by_index), ids.gather(-1, by_index)
            order = values.sort(dim=-1, descending=True, stable=True).indices[..., :k]
            return values.gather(-1, order), ids.gather(-1, order)
    values, ids = torch.sort(x if offset is None else offset + x, dim=-1, descending=True, stable=True)
    return values[..., :k], ids[..., :k]


def _keyed_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The stable top-k of float32 ``x`` (no NaN) in one ``torch.topk``, no host read: each value and its index are
    packed into one int64 key, the value's bits in an order-preserving form above the index reversed, so keys are
    distinct and order as the stable descending sort does (larger value first, then the lower index)."""
    bits = (x + 0.0).view(torch.int32)  # + 0.0: -0.0 becomes +0.0, so values that compare equal have equal bits
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)  # negative floats: larger bits, smaller
    reversed_index = torch.arange(x.shape[-1] - 1, -1, -1, device=x.device)
    ids = torch.topk((ordered << 32) | reversed_index, k, dim=-1).indices
    return torch.gather(x, -1, ids), ids


def _any_row(*flags: torch.Tensor) -> list[bool]:
    """Whether any row is set, for each of ``flags [B]``: one host read for all."""
    return torch.stack([f.any() for f in flags]).tolist()


def _gumbel(shape, random: RowRandom, device) -> torch.Tensor:
    u = random.uniform(shape, device).clamp_(1e-20, 1.0 - 1e-7)
    return -torch.log(-torch.log(u))


def _truncated_gumbel(parent_g: torch.Tensor, g: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Gumbels ``g`` conditioned on their maximum ``z`` being ``parent_g`` (Kool et al., eq. 23, stable form)."""
    v = parent_g - g + _log1mexp(g - z)
    return parent_g - v.clamp(min=0) - torch.log1p(torch.exp(-v.abs()))


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x <= 0 (-inf at 0)."""
    x = x.clamp(max=0)
    return torch.where(x > -math.log(2), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))
