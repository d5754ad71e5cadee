"""The draft side of one engine step for a whole batch: catch up on what the target just processed, grow the trees.

Every engine (vLLM, SGLang) and the reference generator drive :class:`Speculator` the same way, once per step:

    rows = DraftRows(...)            what the target processed for each request, as draft entries
    tree = speculator.step(kv, rows, params, random, shape)

- **Catch-up**: one draft forward over every row's new entries (prompt chunks, or a verified tree's accepted
  path), ragged rows padded to the longest (rows of very different lengths run as two groups); their keys and
  values go to the draft's KV store at the slots the engine gives, so they stay for later steps.
- **Tree**: one draft forward per level for the whole batch (EAGLE-2 expansion, :func:`~eagle3_plugin.tree.build_tree`).
  Level nodes attend to the row's stored context, their ancestors and themselves; their keys and values live
  only in this step's work buffer, preallocated with room for every level (no concatenation).

Position rule: the draft entry at position ``p`` pairs the target's features at ``p`` with the token at ``p + 1``.
After a row's entries up to position ``m - 1``, its root (the token at ``m``, the last emitted one) grows a tree
whose level ``L`` runs at draft position ``m - 1 + L``.

The store (:class:`DraftKV`) is slot-addressed, ``[num_slots, H_kv, D]``: an engine hands views of its own KV
pool (vLLM's paged cache, SGLang's token pool), so the engine budgets, frees and reuses the draft's memory, and
the reference generator allocates one. Rows never read a slot of a position they have not written.

A step that grows no tree (no speculation this step) only stores its entries' keys and values, which need no
attention: the entries go flat (:class:`DraftEntries`, no padding, no rows), and are deferred and stored together
with later ones, in one forward, before the next tree is grown, once :data:`DEFER_ENTRIES` wait, or after
:data:`DEFER_STEPS` such steps. An engine hands them with :meth:`Speculator.store` (or as rows to
:meth:`Speculator.step` with the one-node shape), and calls :meth:`Speculator.flush` before a slot changes owner
(a request finished or preempted), so a deferred entry never lands in another request's slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .config import Eagle3Config
from .draft import Eagle3Draft, grouped_mask, masked_attention
from .output_rules import OutputRules
from .packed_draft import PackedDraft
from .rng import RowRandom
from .sampler import SamplingParams
from .tree import DraftTree, build_chain, build_tree

# Rows whose new entries number at most this run in one padded forward; longer ones (prompt chunks) in another.
SHORT_ROW = 16
# Steps without a tree whose entries are stored together (:meth:`Speculator.flush`), and the most entries waiting.
DEFER_STEPS = 16
DEFER_ENTRIES = 512  # 32 requests: 16 steps' entries, a flush's fixed cost shared by more (stop 41: -25 µs a step)
# A draft logit the output rules mask (:class:`_RuledExpander`): finite, so a tree's scores stay finite through its
# levels (a tree's depth of such sums stays far from float32's range), and probability 0 after the softmax. Id ``i``
# gets it times ``1 + i * MASKED_RAMP``: distinct in float32 and falling with the id, so masked ids leave no tie for a
# tree's top-k to break (a tie sends it to a full sort: 4 ms a level at 12 requests under a grammar), ranked as the
# tie-break would rank them.
MASKED_DRAFT_LOGIT = -1e30
MASKED_RAMP = 2.0 ** -20


@dataclass(frozen=True)
class TreeShape:
    """One step's tree: ``depth`` levels, ``top_k`` children per expanded node, ``total_tokens`` incl. the root."""

    depth: int
    top_k: int
    total_tokens: int

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash((self.depth, self.top_k, self.total_tokens)))

    def __hash__(self) -> int:  # computed once: the budget keys its estimates by shape, ~100 lookups a step
        return self._hash

    @classmethod
    def of(cls, config: Eagle3Config) -> "TreeShape":
        return cls(config.depth, config.top_k, config.total_tokens)

    @property
    def label(self) -> str:
        """``none`` (one node: no speculation), ``chain D`` or ``tree D/K/N``, as logs and benchmarks print it."""
        if self.total_tokens == 1:
            return "none"
        return f"chain {self.depth}" if self.top_k == 1 else f"tree {self.depth}/{self.top_k}/{self.total_tokens}"


@dataclass
class DraftKV:
    """The draft's keys and values by slot: ``keys``, ``values`` ``[num_slots, H_kv, D]``."""

    keys: torch.Tensor
    values: torch.Tensor

    @classmethod
    def allocate(cls, num_slots: int, num_kv_heads: int, head_dim: int, dtype, device=None) -> "DraftKV":
        keys = torch.zeros(num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)
        return cls(keys, torch.zeros_like(keys))


@dataclass
class DraftEntries:
    """Draft entries to store without attention (a step that grows no tree), flat: entry ``i`` sits at draft
    position ``positions[i]``, in store slot ``slots[i]``, and pairs its target features ``features[i]`` (``3H``,
    the entries' own copy: an engine's table is reused by its next step) with ``tokens[i]``."""

    slots: torch.Tensor
    positions: torch.Tensor
    tokens: torch.Tensor
    features: torch.Tensor

    def __len__(self) -> int:
        return self.slots.shape[0]

    @classmethod
    def concat(cls, parts: list["DraftEntries"]) -> "DraftEntries":
        return cls(*(torch.cat([getattr(p, name) for p in parts]) for name in ("slots", "positions", "tokens",
                                                                               "features")))


@dataclass
class DraftRows:
    """One step's new draft entries, ``B`` rows padded to ``Q``: row ``b``'s entry ``j < count[b]`` sits at draft
    position ``start[b] + j`` and pairs its target features (``3H`` wide) with ``tokens[b, j]``, the token after it;
    its last token is the root of the row's next tree. ``slots [B, L]``: the store slot of each of the row's
    positions ``0 .. L - 1``, ``L >= start + count``; positions before ``start`` are already stored.

    ``features``: ``[B, Q, 3H]``; or, with ``feature_rows [B, Q]``, the table ``[T, 3H]`` an entry's features are
    read from (entry ``j`` of row ``b``: ``features[feature_rows[b, j]]``), so an engine hands what its target
    captured and nothing is copied into a padded batch (a prompt chunk beside one-token rows would make it
    ``B x chunk`` wide) until a group of rows runs. The table must stay unchanged until the step returns."""

    slots: torch.Tensor
    start: torch.Tensor
    count: torch.Tensor
    tokens: torch.Tensor
    features: torch.Tensor
    feature_rows: Optional[torch.Tensor] = None

    def padded_features(self) -> torch.Tensor:
        """``[B, Q, 3H]``."""
        if self.feature_rows is None:
            return self.features
        return self.features.index_select(0, self.feature_rows.flatten()).view(*self.feature_rows.shape, -1)

    def select(self, index: torch.Tensor) -> "DraftRows":
        width = int(self.count[index].max())
        if self.feature_rows is None:
            features, feature_rows = self.features[index, :width], None
        else:
            features, feature_rows = self.features, self.feature_rows[index, :width]
        return DraftRows(self.slots[index], self.start[index], self.count[index], self.tokens[index, :width],
                         features, feature_rows)

    def entries(self) -> DraftEntries:
        """The new entries, flat (row by row), with their own features."""
        new = torch.arange(self.tokens.shape[1], device=self.tokens.device)
        is_new = new[None] < self.count[:, None]
        positions = self.start[:, None] + new
        slots = self.slots.gather(1, positions.clamp(max=self.slots.shape[1] - 1))
        features = self.features[is_new] if self.feature_rows is None else self.features[self.feature_rows[is_new]]
        return DraftEntries(slots[is_new], positions[is_new], self.tokens[is_new], features)

    @property
    def roots(self) -> torch.Tensor:
        return self.tokens.gather(1, (self.count - 1)[:, None])[:, 0]


@dataclass
class _Context:
    """A step's attention context per row, ``[B, H_kv, L, D]`` with ``valid [B, L]`` (free columns after ``used``)."""

    keys: torch.Tensor
    values: torch.Tensor
    valid: torch.Tensor
    used: int


class Speculator:
    def __init__(self, draft: Eagle3Draft, config: Eagle3Config):
        """``draft``'s weights are packed here (:class:`~eagle3_plugin.packed_draft.PackedDraft`): final by now."""
        self.draft, self.config = draft, config
        self.packed = PackedDraft.of(draft)
        self._deferred: list[DraftEntries] = []  # steps without a tree whose entries are not stored yet
        self._deferred_entries = 0
        self._deferred_to: Optional[DraftKV] = None  # the store they go to
        self._workspace = _Workspace()

    @torch.no_grad()  # drafting never trains: no graph, and the workspace's gathers write in place
    def step(self, kv: DraftKV, rows: DraftRows, params: Optional[SamplingParams], random: Optional[RowRandom] = None,
             shape: Optional[TreeShape] = None, rules: Optional[OutputRules] = None) -> Optional[DraftTree]:
        """Catch every row up on its new entries, then grow each row's tree of ``shape`` (default: the config's;
        ``total_tokens == 1``: catch up only, returns None, and ``params`` may be None). ``params``, ``random`` and
        ``rules`` (the rows' penalties and the like, as of the trees' roots; the draft obeys some: see
        :class:`_RuledExpander`) are per row."""
        shape = shape or TreeShape.of(self.config)
        if shape.total_tokens == 1:  # catch up only: stored later (see :meth:`store`)
            self.store(kv, rows.entries())
            return None
        extent = _RowExtent.of(rows)
        self.packed.reserve_positions(extent.longest_end + shape.depth)
        self.flush()
        tree_columns = (shape.depth - 1) * shape.top_k
        groups = _row_groups(rows.count, extent.short_rows)
        if len(groups) == 1:
            context, root_hidden = self._catch_up(kv, rows, tree_columns, extent.longest_start)
        else:
            root_hidden = torch.empty(rows.count.shape[0], self.packed.config.hidden_size,
                                      dtype=rows.features.dtype, device=rows.features.device)
            for index in groups:
                selected = rows.select(index)
                root_hidden[index] = self._catch_up(kv, selected, 0, int(selected.start.max()))[1]
            context = self._stored_context(kv, rows.slots, rows.start + rows.count, tree_columns, extent.longest_end)
        expand = _LevelExpander(self.packed, context, root_hidden, rows.start + rows.count - 1, shape.top_k)
        sample, hot_ids = self.config.tree_sampler == "real", self.packed.hot_ids
        root_logits = self.packed.logits(root_hidden)
        draft_rules = rules.for_draft() if rules is not None else None
        if draft_rules is not None:
            expand = _RuledExpander(expand, draft_rules, hot_ids, rows.roots.shape[0])
            root_logits = expand.root(root_logits)
        if shape.top_k == 1 and shape.total_tokens == shape.depth + 1:
            return build_chain(rows.roots, root_logits, expand, shape.depth, params.temperature, sample, hot_ids,
                               random)
        return build_tree(rows.roots, root_logits, expand, shape.depth, shape.top_k, shape.total_tokens,
                          params.temperature, sample, hot_ids, random)

    def store(self, kv: DraftKV, entries: DraftEntries) -> None:
        """Store ``entries`` (a step that grows no tree): deferred, then stored with later ones in one forward (see
        the module's docstring)."""
        if kv is not self._deferred_to:
            self.flush()
            self._deferred_to = kv
        self._deferred.append(entries)
        self._deferred_entries += len(entries)
        if len(self._deferred) >= DEFER_STEPS or self._deferred_entries >= DEFER_ENTRIES:
            self.flush()

    @torch.no_grad()
    def flush(self) -> None:
        """Store every deferred entry now, in one draft forward: only their keys and values."""
        if not self._deferred:
            return
        entries = DraftEntries.concat(self._deferred)
        self._deferred, self._deferred_entries = [], 0
        self.packed.reserve_positions(int(entries.positions.max()) + 1)
        keys, values = self.packed.keys_values(entries.tokens[None], self.packed.fuse(entries.features)[None],
                                               entries.positions[None])
        self._deferred_to.keys.index_copy_(0, entries.slots, keys[0].transpose(0, 1))
        self._deferred_to.values.index_copy_(0, entries.slots, values[0].transpose(0, 1))

    def _catch_up(self, kv: DraftKV, rows: DraftRows, extra_columns: int,
                  longest_start: int) -> tuple[_Context, torch.Tensor]:
        """One draft forward over ``rows``' new entries, queried at each row's last one; returns the context
        (stored prefix, then the new entries, then ``extra_columns`` free ones) and each row's output at its last
        entry. An entry's key and value need no attention, so the other entries run no query."""
        b, q = rows.tokens.shape
        device = rows.tokens.device
        context = self._stored_context(kv, rows.slots, rows.start, q + extra_columns, longest_start)
        new = torch.arange(q, device=device)
        is_new = new[None] < rows.count[:, None]
        allowed = torch.cat([context.valid[:, None, :context.used], is_new[:, None, :],
                             torch.zeros(b, 1, extra_columns, dtype=torch.bool, device=device)], dim=2)
        mask = grouped_mask(allowed, self.packed.query_groups, rows.features.dtype)
        attention = _BufferAttention(context, context.used, mask, self.packed.attention_scale)
        out = self.packed.forward(rows.tokens, self.packed.fuse(rows.padded_features()), rows.start[:, None] + new,
                                  attention, queries=(rows.count - 1)[:, None])
        context.valid[:, context.used:context.used + q] = is_new
        written = slice(context.used, context.used + q)
        self._write(kv, rows, context.keys[:, :, written], context.values[:, :, written])
        context.used += q
        return context, out[:, 0]

    @staticmethod
    def _write(kv: DraftKV, rows: DraftRows, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store the new entries' ``keys``/``values [B, Hkv, Q, D]`` at their rows' slots."""
        new = torch.arange(keys.shape[2], device=keys.device)
        is_new = torch.nonzero(new[None] < rows.count[:, None], as_tuple=True)  # one host read (the count)
        positions = (rows.start[:, None] + new).clamp(max=rows.slots.shape[1] - 1)
        slots = rows.slots.gather(1, positions)[is_new]
        kv.keys.index_copy_(0, slots, keys.transpose(1, 2)[is_new])
        kv.values.index_copy_(0, slots, values.transpose(1, 2)[is_new])

    def _stored_context(self, kv: DraftKV, slots: torch.Tensor, length: torch.Tensor, extra_columns: int,
                        width: int) -> _Context:
        """Each row's stored positions ``0 .. length - 1`` (``width``: the longest) read into the workspace with
        ``extra_columns`` more (copies of position 0 until the step writes them; masked until then)."""
        b = slots.shape[0]
        columns = width + extra_columns
        index = slots[:, :width]
        if extra_columns:
            index = torch.cat([index, slots[:, :1].expand(b, extra_columns)], dim=1)
        keys, values = self._workspace.gather(kv, index.flatten())
        valid = torch.zeros(b, columns, dtype=torch.bool, device=slots.device)
        valid[:, :width] = torch.arange(width, device=slots.device)[None] < length[:, None]
        return _Context(keys.view(b, columns, *keys.shape[1:]).transpose(1, 2),
                        values.view(b, columns, *values.shape[1:]).transpose(1, 2), valid, width)


class _Workspace:
    """Where a step's context is gathered: two buffers kept from step to step and grown when a step needs more.
    A context is megabytes under load; fresh tensors of that size each step cost more in page faults on a CPU than
    the gather itself."""

    def __init__(self):
        self.keys: Optional[torch.Tensor] = None
        self.values: Optional[torch.Tensor] = None

    def gather(self, kv: DraftKV, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv``'s keys and values at slots ``index [N]``, ``[N, H_kv, D]`` each, views of the buffers (valid until
        the next call)."""
        n = index.shape[0]
        fits = self.keys is not None and self.keys.shape[0] >= n and self.keys.shape[1:] == kv.keys.shape[1:] \
            and self.keys.dtype == kv.keys.dtype and self.keys.device == kv.keys.device
        if not fits:  # doubling: a context grows by a few columns a step
            size = n if self.keys is None else max(n, 2 * self.keys.shape[0])
            self.keys = kv.keys.new_empty(size, *kv.keys.shape[1:])
            self.values = torch.empty_like(self.keys)
        keys = torch.index_select(kv.keys, 0, index, out=self.keys[:n])
        values = torch.index_select(kv.values, 0, index, out=self.values[:n])
        return keys, values


class _BufferAttention:
    """The draft's attention over a :class:`_Context`: the new keys and values go to columns ``at .. at + Q - 1``
    of its buffer, then every query attends under ``mask``, additive, ``[B, 1, groups * Q, L]``
    (:func:`grouped_mask`)."""

    def __init__(self, context: _Context, at: int, mask: torch.Tensor, scale: float):
        self.context, self.at, self.mask, self.scale = context, at, mask, scale

    def __call__(self, q, k, v):
        columns = slice(self.at, self.at + k.shape[2])
        self.context.keys[:, :, columns] = k
        self.context.values[:, :, columns] = v
        return masked_attention(q, self.context.keys, self.context.values, self.mask, self.scale)


class _LevelExpander:
    """The ``expand`` callback of :func:`build_tree`: level ``L``'s ``k`` frontier nodes run at draft position
    ``root_position + L``, fed their parent's output, and see the row's context, their ancestors in earlier
    levels and themselves; their keys go to the context's free columns, ``k`` per level. The attention mask is
    built once per step: the context's part stays, each level writes the tree columns it can see."""

    def __init__(self, draft: PackedDraft, context: _Context, root_hidden: torch.Tensor, root_position: torch.Tensor,
                 top_k: int):
        self.draft, self.context, self.root_position = draft, context, root_position
        b, device = context.valid.shape[0], context.valid.device
        groups = draft.query_groups
        seen = torch.cat([context.valid[:, None, :context.used].expand(b, top_k, -1),
                          torch.zeros(b, top_k, context.valid.shape[1] - context.used, dtype=torch.bool,
                                      device=device)], dim=2)
        self.mask = grouped_mask(seen, groups, root_hidden.dtype)  # [B, 1, groups * k, L]
        self.tree_mask = self.mask.view(b, groups, top_k, -1)[:, :, :, context.used:]  # the tree columns' part
        self.hidden = root_hidden[:, None]  # outputs of the previous level's frontier (the root's at first)
        self.ancestors = None  # [B, k, tree columns]: ancestor-or-self among the levels so far (trees, not chains)
        self.eye = None  # [B, k, k] each frontier node is itself

    def __call__(self, level: int, tokens: torch.Tensor, parent_slot: torch.Tensor) -> torch.Tensor:
        b, k = tokens.shape
        c = self.context
        if k == 1:  # a chain: the one node's parent is the previous level's node, its ancestors every level's
            parent_hidden = self.hidden
            self.tree_mask[..., level - 1] = 0.0
        else:
            parent_hidden = torch.gather(self.hidden, 1, parent_slot[..., None].expand(-1, -1, self.hidden.shape[-1]))
            if self.ancestors is None:
                self.ancestors = torch.zeros(b, k, self.tree_mask.shape[-1], dtype=torch.bool, device=tokens.device)
                self.eye = torch.eye(k, dtype=torch.bool, device=tokens.device).expand(b, k, k)
            else:
                self.ancestors = torch.gather(self.ancestors, 1, parent_slot[..., None].expand_as(self.ancestors))
            self.ancestors[:, :, (level - 1) * k:level * k] = self.eye
            self.tree_mask.copy_(torch.where(self.ancestors, 0.0, float("-inf"))[:, None])
        attention = _BufferAttention(c, c.used + (level - 1) * k, self.mask, self.draft.attention_scale)
        self.hidden = self.draft.forward(tokens, parent_hidden, self.root_position[:, None] + level, attention)
        return self.draft.logits(self.hidden)


class _RuledExpander:
    """An ``expand`` callback whose draft logits obey the rows' output rules meant for a draft (allowed ids, a grammar,
    bad words, ``min_tokens``, a bias: :meth:`~eagle3_plugin.output_rules.OutputRules.for_draft`), each frontier node's
    for its own path (a grammar's at the nodes the engine verifies under it), so the draft proposes only what the target
    may emit (acceptance; verification applies every rule to the target either way). Penalties are left out (see
    ``for_draft``; on the bundled checkpoint, 12 prompts, greedy: frequency 1.5 2.62 -> 2.83 tokens a round, frequency
    0.5 3.49 -> 3.40). The draft's distribution is the one it draws from, so sampled trees stay lossless.

    A masked id gets :data:`MASKED_DRAFT_LOGIT` (ramped), not -inf: a node with fewer allowed ids than ``top_k`` still
    grows ``top_k`` children, and the tree's scores must stay finite and fall strictly below their parent's (an -inf
    parent's Gumbel would be NaN). Such children have draft probability 0, as the masked ids have target probability 0:
    verification rejects them. A node the masks leave no draft id keeps its raw logits (the target's vocabulary holds
    ids the draft's lacks): its proposals are then rejected too."""

    def __init__(self, expand, rules: OutputRules, hot_ids: torch.Tensor, batch: int):
        self.expand, self.rules, self.hot_ids = expand, rules, hot_ids
        self.paths = torch.empty(batch, 1, 0, dtype=torch.long, device=hot_ids.device)  # frontier paths below the root
        self.leading = torch.zeros(batch, dtype=torch.long, device=hot_ids.device)  # see :meth:`_leading`
        ids = torch.arange(hot_ids.numel(), device=hot_ids.device)
        self.masked_logits = MASKED_DRAFT_LOGIT * (1 + ids * MASKED_RAMP)

    def root(self, logits: torch.Tensor) -> torch.Tensor:
        """The root's draft logits ``[B, Vd]`` under the rules."""
        return self._ruled(logits[:, None], 0)[:, 0]

    def __call__(self, level: int, tokens: torch.Tensor, parent_slot: torch.Tensor) -> torch.Tensor:
        parents = self.paths.gather(1, parent_slot[..., None].expand(-1, -1, self.paths.shape[2]))
        self.paths = torch.cat([parents, tokens[..., None]], dim=2)
        if self.rules.grammars is not None and not self.rules.grammars.whole_tree:
            self.leading = self._leading(parent_slot)
        return self._ruled(self.expand(level, tokens, parent_slot), level)

    def _leading(self, parent_slot: torch.Tensor) -> torch.Tensor:
        """``[B]``: the frontier slot of each row's leading-path node (-1 once the path has left the frontier), the
        only node whose grammar is read where the engine verifies a grammar row along that path only
        (:meth:`~eagle3_plugin.tree.DraftTree.leading_paths`). A frontier is in score order, and a node's children's
        scores fall in their sampling order, so the leading node's first child, when in the frontier, is the first
        slot whose parent it is."""
        is_child = parent_slot == self.leading[:, None]  # a row whose path has left matches no slot
        return torch.where(is_child.any(1), is_child.int().argmax(1), -1)

    def _grammar_at(self) -> Optional[torch.Tensor]:
        """``[B, K]`` bool: the frontier nodes whose grammar is read (every one, or each row's leading-path node)."""
        grammars = self.rules.grammars
        if grammars is None:
            return None
        if grammars.whole_tree:
            return torch.ones(self.paths.shape[:2], dtype=torch.bool, device=self.paths.device)
        slots = torch.arange(self.paths.shape[1], device=self.paths.device)
        return slots[None, :] == self.leading[:, None]  # a row whose path has left the frontier (-1) reads none

    def _ruled(self, logits: torch.Tensor, depth: int) -> torch.Tensor:
        """The frontier's draft logits under the rules, float32."""
        depths = torch.full(self.paths.shape[:2], depth, dtype=torch.long, device=logits.device)
        raw = logits.float()
        ruled = self.rules.apply_at(self.paths, depths, raw.clone(), self.hot_ids, self._grammar_at())
        masked = torch.isneginf(ruled)
        nothing_left = masked.all(-1, keepdim=True)
        return torch.where(masked & ~nothing_left, self.masked_logits, torch.where(nothing_left, raw, ruled))


@dataclass(frozen=True)
class _RowExtent:
    """What a step must know of its rows on the host, read in one transfer (each read stalls a GPU's queue): the
    longest row's stored positions before the step and after it, and how many rows are short (:data:`SHORT_ROW`)."""

    longest_start: int
    longest_end: int
    short_rows: int

    @classmethod
    def of(cls, rows: DraftRows) -> "_RowExtent":
        return cls(*torch.stack([rows.start.max(), (rows.start + rows.count).max(),
                                 (rows.count <= SHORT_ROW).sum()]).tolist())


def _row_groups(count: torch.Tensor, short_rows: int) -> list[torch.Tensor]:
    """Row indices to run together: all rows, or the ``short_rows`` short ones and the long ones when both are
    present."""
    if short_rows in (0, count.shape[0]):
        return [torch.arange(count.shape[0], device=count.device)]
    short = count <= SHORT_ROW
    return [torch.nonzero(short)[:, 0], torch.nonzero(~short)[:, 0]]
