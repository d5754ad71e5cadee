"""One engine step of vLLM's runner, translated to and from the core: the trees it verifies, what they emit, the
KV moves of the accepted paths, and the draft entries for the core :class:`~eagle3_plugin.speculator.Speculator`.

Batch rows are vLLM's (``input_batch`` order). A row with scheduled draft tokens verifies our last tree for its
request, cut to the nodes the scheduler kept; every other row (prompt chunk, plain decode) verifies a root-only
tree, which is plain sampling from its last token's logits. All of it runs batched, one op per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import torch

from ..output_rules import OutputRules
from ..proposed_trees import ProposedTrees
from ..sampler import SamplingParams, Verdict, unscored_to_bonus, verify_tree, verify_tree_rows
from ..speculator import DraftEntries, DraftRows
from ..tree import DraftTree
from .output_rules import min_p_of
from .paged_kv import block_slots
from .tree_attention import TreeAttention
from .waiting import waiting as waiting_requests


@dataclass
class Step:
    req_ids: list
    base: torch.Tensor  # [B] position of each row's first query token (a tree's root)
    flat_start: torch.Tensor  # [B] index of that token in the step's flat token list
    count: torch.Tensor  # [B] query tokens of the row
    node_count: torch.Tensor  # [B] tree nodes verified (1: root only)
    prefilling: torch.Tensor  # [B] bool: a prompt chunk that is not the last (vLLM discards its sample)
    tree: DraftTree
    tree_attention: Optional[TreeAttention]
    joined: bool = False  # a request joined the batch this step (new, or resumed after preemption)
    ended: bool = False  # a request ended since the last step
    waiting: bool = False  # requests wait in the scheduler: the batch is refilled as its requests end
    rules: Optional[OutputRules] = None  # the rows' penalties and the like, as of this step (None: no row has any)
    structured: Optional[torch.Tensor] = None  # [B] bool: rows with a grammar (None: no row has one)
    grammar_chains: Optional[torch.Tensor] = None  # [B] bool: decoding rows with a grammar (their trees are chains)
    cut_child: Optional[torch.Tensor] = None  # [B] bool: rows whose tree has an unscored node after its scheduled ones
    verdict: Optional[Verdict] = None
    emitted: Optional[torch.Tensor] = None  # [B, W] int32: accepted draft tokens then the bonus, -1 padded
    began: float = 0.0  # when the step's preparation began (perf_counter)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @cached_property
    def decode_only(self) -> bool:
        """Whether every row is a decode (its query tokens are its tree's nodes: no prompt chunk)."""
        return bool((self.count == self.node_count).all())

    @property
    def continues_decoding(self) -> bool:
        """Whether the engine ran straight on from its last step into this one: a decode of the same requests (a
        request that joins, even as one cached prompt token, may have come after the engine idled)."""
        return self.decode_only and not self.joined

    @cached_property
    def has_trees(self) -> bool:
        """Whether any row verifies draft tokens (else every row is a plain decode or prompt chunk)."""
        cut = self.cut_child is not None and bool(self.cut_child.any())
        return self.tree.size > 1 and (cut or bool((self.node_count > 1).any()))

    @property
    def chains_only(self) -> bool:
        """Whether every row has a grammar: vLLM verifies a grammar row along a chain only (a tree is cut to its
        leading path), so the budget picks among chains (:meth:`~eagle3_plugin.budget.TreeBudget.shape`)."""
        return self.structured is not None and bool(self.structured.all())

    @cached_property
    def one_entry_per_row(self) -> bool:
        """Whether every row ran one token and verified no tree (a plain decode step): one draft entry each."""
        return not self.has_trees and int(self.count.max()) == 1

    @classmethod
    def build(cls, runner, scheduler_output, num_scheduled_tokens, pending: ProposedTrees) -> "Step":
        """The step vLLM scheduled; sets tree rows' positions to root + depth. ``pending``: our last trees."""
        batch = runner.input_batch
        req_ids = list(batch.req_ids)
        b = len(req_ids)
        base = torch.from_numpy(batch.num_computed_tokens_cpu[:b].copy()).long()
        flat_start = torch.from_numpy(runner.query_start_loc.np[:b].copy()).long()
        count = torch.from_numpy(num_scheduled_tokens[:b]).long()
        spec = scheduler_output.scheduled_spec_decode_tokens
        prefilling = torch.from_numpy(runner.discard_request_mask.np[:b].copy())
        joined = bool(scheduler_output.scheduled_new_reqs or scheduler_output.scheduled_cached_reqs.resumed_req_ids)
        ended, waiting = bool(scheduler_output.finished_req_ids), waiting_requests(scheduler_output) > 0
        structured = None
        if scheduler_output.has_structured_output_requests:
            structured = torch.tensor([runner.requests[r].sampling_params.structured_outputs is not None
                                       for r in req_ids])
        if not spec and structured is None:  # no draft tokens scheduled (a step that drafted nothing, or prompts only)
            roots = torch.zeros(b, dtype=torch.long)
            return cls(req_ids, base, flat_start, count, torch.ones_like(roots), prefilling, DraftTree.root_only(roots),
                       None, joined, ended, waiting)
        node_count = torch.tensor([len(spec.get(r, ())) + 1 for r in req_ids])
        grammar_chains = None if structured is None else structured & (count == node_count)
        tree, cut_child = _trees(pending, req_ids, node_count, grammar_chains)
        step = cls(req_ids, base, flat_start, count, node_count, prefilling, tree, None, joined, ended, waiting,
                   structured=structured, grammar_chains=grammar_chains, cut_child=cut_child)
        has_tree = node_count > 1
        if bool(has_tree.any()):
            step._check_scheduled_tokens(runner.input_ids.cpu)
            nodes = torch.arange(tree.size)
            is_node = (nodes[None] < node_count[:, None]) & has_tree[:, None]
            not_path = has_tree & ~tree.paths(node_count)
            if bool(not_path.any()):  # a path's positions (root + node index) are vLLM's already
                is_node &= not_path[:, None]
                flat = (flat_start[:, None] + nodes)[is_node]
                runner.positions[flat] = (base[:, None] + tree.depths)[is_node].to(runner.positions.dtype)
                rows = torch.nonzero(not_path)[:, 0]
                block_size = runner.kv_cache_config.kv_cache_groups[runner._target_group].kv_cache_spec.block_size
                step.tree_attention = TreeAttention.build(rows, flat_start[rows], base[rows], node_count[rows],
                                                          tree.ancestor_mask()[rows], block_size,
                                                          whole_step=bool(not_path.all()) and step.decode_only)
        return step

    def _check_scheduled_tokens(self, input_ids: torch.Tensor) -> None:
        nodes = torch.arange(self.tree.size)
        is_draft = (nodes[None] < self.node_count[:, None]) & (nodes[None] > 0)
        flat = (self.flat_start[:, None] + nodes)[is_draft]
        if not torch.equal(input_ids[flat].long(), self.tree.tokens[is_draft]):
            raise RuntimeError("eagle3-plugin: the scheduled draft tokens are not our last trees")

    def _logit_rows(self) -> torch.Tensor:
        """``[B, N]``: the flat logits row of each verified node (vLLM samples ``node_count`` per row)."""
        offset = torch.cumsum(self.node_count, 0) - self.node_count
        nodes = torch.arange(self.tree.size)
        return offset[:, None] + torch.where(nodes[None] < self.node_count[:, None], nodes, 0)

    def verify(self, logits, params: SamplingParams, method: str, random) -> None:
        """Decide every row: ``verdict`` and ``emitted``, as vLLM's rejection sampler would emit them. The step's
        ``rules`` apply at each node for its path (on a copy of the tree's logits)."""
        if self.rules is None:
            self.verdict = verify_tree_rows(self.tree, logits, self._logit_rows(), params, method, random)
        else:
            nodes = self.rules.apply(self.tree, logits[self._logit_rows()].float())
            self.verdict = verify_tree(self.tree, nodes, params, method, random)
        if self.cut_child is not None:
            self.verdict = unscored_to_bonus(self.verdict, self.tree, self.node_count)
        self.emitted = self.verdict.emitted(self.tree).to(torch.int32)

    def sampled(self, tokens: torch.Tensor) -> None:
        """A step without trees, sampled by vLLM: one token per row (``tokens [B]``)."""
        zeros = torch.zeros_like(tokens)
        self.verdict = Verdict(zeros[:, None], zeros, tokens)
        self.emitted = tokens[:, None].to(torch.int32)

    def emitted_logit_rows(self) -> torch.Tensor:
        """``[B, W]``: the flat logits row that predicted each emitted token (padding: the row's first)."""
        return self._logit_rows().gather(1, self.verdict.accepted.clamp(min=0))

    def moves(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat token indices ``(src, dst)``: each accepted node's KV goes to the slot of its depth."""
        path = self.verdict.accepted
        depth = torch.arange(path.shape[1])
        moved = (path >= 0) & (path != depth)
        return (self.flat_start[:, None] + path)[moved], (self.flat_start[:, None] + depth)[moved]

    def prefilling_rows(self) -> list[int]:
        return torch.nonzero(self.prefilling)[:, 0].tolist()


def _trees(pending: ProposedTrees, req_ids: list, node_count: torch.Tensor,
           chains: Optional[torch.Tensor]) -> tuple[DraftTree, Optional[torch.Tensor]]:
    """Each row's tree: its request's last proposal cut to ``node_count`` nodes (1: the root alone); and which rows
    keep one more node. Rows ``chains`` (decode rows with a grammar, whose proposals are chains) keep the first
    node the scheduler dropped, as an unscored leaf (see :func:`~eagle3_plugin.sampler.unscored_to_bonus`): vLLM
    drops a chain's draft tokens from the first its grammar forbids, so which nodes are verified depends on their
    tokens, and the dropped child must still be verified for the target's law at T > 0."""
    trees, found = pending.get(req_ids)
    if bool((~found & (node_count > 1)).any()):
        raise RuntimeError("eagle3-plugin: a request has scheduled draft tokens but no tree of ours")
    if trees is None:
        return DraftTree.root_only(torch.zeros(len(req_ids), dtype=torch.long)), None
    kept, cut_child = node_count, None
    if chains is not None:
        proposed = (trees.depths == torch.arange(trees.size)).long().cumprod(1).sum(1)  # each row's leading path
        cut_child = chains & found & (node_count < proposed)
        kept = node_count + cut_child.long()
    return (trees if bool((kept == trees.size).all()) else trees.truncated(kept)), cut_child


def draft_rows(step: Step, runner, features: torch.Tensor, block_table: torch.Tensor, block_size: int) -> DraftRows:
    """The draft entries this step gives each row: a tree row's accepted path (root first) paired with the tokens
    it emitted; any other row's query tokens paired with the next token (the one it emitted, or the next prompt
    token for a prompt chunk that is not the last)."""
    verdict, b = step.verdict, step.num_reqs
    if step.one_entry_per_row:
        slots = block_slots(block_table, int(step.base.max()) + 1, block_size)
        return DraftRows(slots, step.base, step.count, _last_tokens(step, runner)[:, None],
                         features[step.flat_start][:, None])
    has_tree = step.node_count > 1
    entries = torch.where(has_tree, verdict.num_accepted + 1, step.count)
    width = int(entries.max())
    j = torch.arange(width)
    path = verdict.accepted[:, :width].clamp(min=0)
    if path.shape[1] < width:
        path = torch.cat([path, path.new_zeros(b, width - path.shape[1])], dim=1)
    node = torch.where(has_tree[:, None], path, j[None])
    src = (step.flat_start[:, None] + node).clamp(max=features.shape[0] - 1)
    input_ids = runner.input_ids.cpu
    following = input_ids[(src + 1).clamp(max=input_ids.shape[0] - 1)].long()
    plain = torch.where(j[None] == (step.count - 1)[:, None], _last_tokens(step, runner)[:, None], following)
    emitted = step.emitted.long()
    if emitted.shape[1] < width:
        emitted = torch.cat([emitted, emitted.new_zeros(b, width - emitted.shape[1])], dim=1)
    tokens = torch.where(has_tree[:, None], emitted[:, :width], plain).clamp(min=0)  # padding: any valid id
    slots = block_slots(block_table, int((step.base + entries).max()), block_size)
    return DraftRows(slots, step.base, entries, tokens, features, src)


def draft_entries(step: Step, runner, features: torch.Tensor, block_table: torch.Tensor, block_size: int,
                  slot_mapping: torch.Tensor) -> DraftEntries:
    """:func:`draft_rows`' entries, flat, for a step that grows no tree. A decode step's (one entry per row) slots are
    the step's own: ``slot_mapping``, vLLM's slot of each of the step's tokens in the draft's KV group, at each row's
    token (the entry's position is that token's), without the rows' slot tables."""
    if not step.one_entry_per_row:
        return draft_rows(step, runner, features, block_table, block_size).entries()
    return DraftEntries(slot_mapping.index_select(0, step.flat_start).long(), step.base, _last_tokens(step, runner),
                        features.index_select(0, step.flat_start))


def _last_tokens(step: Step, runner) -> torch.Tensor:
    """``[B]``: the token after each row's last query token: the one it emitted, or for a prompt chunk that is not
    the last, the next prompt token."""
    emitted = step.emitted[:, 0].long()
    if not bool(step.prefilling.any()):
        return emitted
    token_ids = torch.from_numpy(runner.input_batch.token_ids_cpu)
    rows = torch.arange(step.num_reqs)
    next_prompt = token_ids[rows, (step.base + step.count).clamp(max=token_ids.shape[1] - 1)].long()
    return torch.where(step.prefilling, next_prompt, emitted)


def remaining_tokens(runner, num_reqs: int) -> torch.Tensor:
    """``[B]``: the most tokens each row's request may still emit (its ``max_tokens``, within the model's length)."""
    batch = runner.input_batch
    room = runner.max_model_len - torch.from_numpy(batch.num_tokens_no_spec[:num_reqs]).long()
    limits = [runner.requests[r].sampling_params.max_tokens for r in batch.req_ids[:num_reqs]]
    emitted = torch.from_numpy(batch.num_tokens_no_spec[:num_reqs] - batch.num_prompt_tokens[:num_reqs]).long()
    limit = torch.tensor([runner.max_model_len if n is None else n for n in limits]) - emitted
    return torch.minimum(limit, room).clamp(min=1)


def sampling_params(metadata, num_reqs: int, vocab_size: int) -> SamplingParams:
    """vLLM's per-row sampling settings as the core's (greedy rows: temperature 0; top-k at the vocabulary: off;
    ``min_p`` from its logits processor)."""
    temperature = (torch.zeros(num_reqs) if metadata.temperature is None
                   else metadata.temperature[:num_reqs].float().clamp(min=0))
    top_k = (torch.zeros(num_reqs, dtype=torch.long) if metadata.top_k is None
             else metadata.top_k[:num_reqs].long())
    top_p = torch.ones(num_reqs) if metadata.top_p is None else metadata.top_p[:num_reqs].float()
    return SamplingParams(temperature, torch.where(top_k >= vocab_size, 0, top_k), top_p,
                          min_p=min_p_of(metadata, num_reqs))
