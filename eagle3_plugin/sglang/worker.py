"""SGLang's EAGLE worker with our draft tree, strict sampler and capture (installed in place of ``EAGLEWorkerV2``).

With ``--speculative-algorithm EAGLE3`` one scheduler step is, for the whole batch (the scheduler, the target's
forward and SGLang's KV bookkeeping are untouched):

    prefill   target forward (our capture hooks its layers) -> the core's Speculator: one draft catch-up
              forward on every request's prompt chunk, one forward per level of every request's next tree
    decode    the trees proposed last step -> TreeVerifyInput -> SGLang's run_eagle_verify (target forward
              over the trees, our sampler via eagle_sample, KV compaction of the accepted path) -> Speculator:
              catch-up on the accepted paths, next trees

Requests' penalties, ``min_new_tokens`` and ``logit_bias`` apply at every tree node for its own path
(:mod:`.output_rules`); the draft obeys ``min_new_tokens``'s held-back stop ids and the ``logit_bias``. Grammars
(regex, JSON schema, EBNF, structural tags) mask the target's logits at each node with SGLang's own mask over our
tree's links (built from the masks the draft read where it can), and the draft's at each node with SGLang's own
matchers (:mod:`.grammars`).

The tree shape of each step comes from the core's :class:`~eagle3_plugin.budget.TreeBudget` (``budget: "auto"``,
the default: the configured tree, its chain or none, whichever the step's load pays for; ``"fixed"``: always the
configured tree). SGLang allocates every request ``--speculative-num-draft-tokens`` slots per step and reads the
verify width from the verify input, so a step verifies whatever shape was drafted: a chain, or the root alone
(a plain decode step through the verify path). A step without a tree defers its draft entries (one catch-up
forward for several steps, :meth:`~eagle3_plugin.speculator.Speculator.flush`); they are stored before any slot
can change owner: whenever the batch's requests differ from the last step's.

The draft's keys and values live in SGLang's own draft token pool (the one its EAGLE draft worker allocated,
same slots as the target's, via ``req_to_token``), so SGLang budgets, frees and retracts them with the request.
SGLang's draft worker is otherwise never run. Other algorithms (EAGLE, STANDALONE) get the stock worker unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import weakref
from typing import Optional

import torch
from torch import nn

from ..budget import NONE, PendingRecord, TreeBudget
from ..checkpoint import validate_against_target
from ..convert import load_source
from ..output_rules import OutputRules, drafting_rules
from ..proposed_trees import ProposedTrees
from ..rng import RowRandom
from ..sampler import SamplingParams
from ..speculator import DraftKV, DraftRows, Speculator, TreeShape
from ..timings import FILE_ENV, PluginTimings
from ..tree import DraftTree
from ..wave import QuietBatch
from . import capture, settings
from .first_tokens import drawing_seeded_rows
from .grammars import draft_grammars, verifying_with
from .output_rules import check_roots, output_rules
from .verify import TreeVerifyInput, build_verify_input
from .waiting import waiting

from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.runtime_context import get_spec
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_utils import TreeMaskMode, _eagle_prefill_tail_tokens, default_tree_mask_mode
from sglang.srt.speculative.eagle_worker_common import run_eagle_verify
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

logger = logging.getLogger(__name__)


class TreeSpeculationWorker(EAGLEWorkerV2):
    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.eagle3 = None
        if not self.speculative_algorithm.is_eagle3():
            return
        if (server_args.tp_size, server_args.pp_size, server_args.dp_size) != (1, 1, 1):
            raise NotImplementedError("eagle3-plugin's SGLang worker runs with tp, pp and dp size 1")
        if default_tree_mask_mode() != TreeMaskMode.QLEN_ONLY:
            raise NotImplementedError("eagle3-plugin's SGLang worker builds CPU (QLEN_ONLY) tree masks only: "
                                      "serve with --device cpu, or without the plugin (SGLANG_PLUGINS)")
        spec = get_spec()
        if self.topk == 1 and self.speculative_num_draft_tokens != self.speculative_num_steps + 1:
            raise ValueError("a chain (--speculative-eagle-topk 1) verifies --speculative-num-steps + 1 tokens; "
                             f"got --speculative-num-draft-tokens {self.speculative_num_draft_tokens}")
        self.eagle3 = settings.worker_config(spec.speculative_draft_model_path, self.speculative_num_steps,
                                             self.topk, self.speculative_num_draft_tokens)
        runner = target_worker.model_runner
        model, hf_config = runner.model, runner.model_config.hf_text_config
        dtype = next(model.parameters()).dtype
        draft, layer_ids = _load_draft(self.eagle3.draft, hf_config, dtype, self.eagle3.layer_ids)
        vocab = draft.config.vocab_size
        with torch.inference_mode():
            table = _input_embeddings(model)(torch.arange(vocab, device=self.device)).detach().clone()
        draft.attach_embedding(nn.Embedding.from_pretrained(table, freeze=True))
        self.capture = capture.target_capture(model, layer_ids, hf_config.num_hidden_layers,
                                              hf_config.hidden_size).__enter__()
        self.speculator = Speculator(draft.to(self.device), self.eagle3)
        self.budget = TreeBudget.for_speculator(self.speculator, dtype, self.device)
        self._pending_record = PendingRecord(self.budget)  # the last decode step's record, until its length shows
        self.proposed = ProposedTrees()
        self._batch_rids: list = []  # the requests of the last step, in order
        self._quiet = QuietBatch()
        self._drafted: TreeShape | None = None  # the shape drafted by the last step, if it was a decode step
        self.vocab_size = vocab
        self._generator = torch.Generator(device=self.device).manual_seed(server_args.random_seed or 0)
        self._seeded: dict[str, torch.Generator] = {}
        self._known: set[str] = set()
        self._draft_kv = None  # SGLang's draft pool, allocated after the workers are built
        self._grammar_masks: dict = {}  # {rid: {path: packed mask}}: what drafting its tree read (:mod:`.grammars`)
        self.timings = PluginTimings()
        self._timings_file = os.environ.get(FILE_ENV)
        logger.info("eagle3-plugin worker: %s, capture ids %s (ours), tree sampler %s, %s budget", self.eagle3.mode,
                    list(layer_ids), self.eagle3.tree_sampler, self.eagle3.budget)

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        if self.eagle3 is None:
            return super().forward_batch_generation(batch, on_publish, grammar_barrier, pp_proxy_tensors)
        if batch.forward_mode.is_idle():
            raise NotImplementedError("eagle3-plugin's SGLang worker does not run idle (DP) batches")
        step_began = time.perf_counter()
        with torch.inference_mode():
            if batch.forward_mode.is_extend():
                result = self._prefill(batch, step_began)
            else:
                result = self._decode(batch, grammar_barrier, step_began)
        self.timings.steps += 1
        if self._timings_file:
            self.timings.write(self._timings_file)
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        return result

    def _prefill(self, batch, step_began: float):
        self._pending_record.release(None)
        params, random = self._sampling(batch)
        with drawing_seeded_rows(batch, params, random):  # a seeded request's first token from its own generator
            result = self.target_worker.forward_batch_generation(batch, capture_hidden_mode=CaptureHiddenMode.NULL)
        features = self.capture.features
        if features.shape[0] != len(batch.input_ids):
            raise RuntimeError(f"captured {features.shape[0]} tokens, the prefill ran {len(batch.input_ids)}")
        for req in batch.reqs:
            self._track(req)
        start = torch.tensor(batch.prefix_lens, dtype=torch.long, device=self.device)
        count = torch.tensor(batch.extend_lens, dtype=torch.long, device=self.device)
        first = torch.cumsum(count, 0) - count
        width = int(count.max())
        j = torch.arange(width, device=self.device)
        src = (first[:, None] + torch.minimum(j[None], count[:, None] - 1)).clamp(max=features.shape[0] - 1)
        following = batch.input_ids[(src + 1).clamp(max=features.shape[0] - 1)].long()
        tails = _eagle_prefill_tail_tokens(batch, result.next_token_ids).long()
        tokens = torch.where(j[None] == (count - 1)[:, None], tails[:, None], following)
        rows = DraftRows(self._slots(batch, start + count), start, count, tokens, features, src)
        emitted = [[t] for t in tails.tolist()]  # SGLang lists the first token after this step
        rules = output_rules(batch, self.vocab_size)
        if rules is not None:
            rules = rules.followed_by(emitted)
        self._propose([req.rid for req in batch.reqs], rows, params, random, batch, step_began, rules, emitted)
        self._drafted = None  # the next decode verifies this step's trees beside older ones
        result.new_seq_lens = batch.seq_lens
        result.next_draft_input = self._next_draft_input(result.next_token_ids)
        return result

    def _decode(self, batch, grammar_barrier, step_began: float):
        began = time.perf_counter()
        self._pending_record.release(began)
        rids = [req.rid for req in batch.reqs]
        trees, found = self.proposed.get(rids)
        if trees is None or not bool(found.all()):
            raise RuntimeError("eagle3-plugin: a request reached decode without a proposed tree")
        params, random = self._sampling(batch)
        rules = output_rules(batch, self.vocab_size)
        if rules is not None:
            check_roots(rules, trees.tokens[:, 0])
        verify_input = build_verify_input(trees, batch.seq_lens, params=params, random=random,
                                          method=self.eagle3.tree_sampler, vocab_size=self.vocab_size, topk=self.topk,
                                          rules=rules)
        root_position = batch.seq_lens.to(torch.long).clone()
        batch.spec_info = verify_input
        self.timings.prepare += time.perf_counter() - began
        with verifying_with(self._grammar_masks):  # the masks drafting the trees read, for SGLang's verify masks
            result = self.verify(batch, grammar_barrier=grammar_barrier)
        self.timings.verify += verify_input.seconds
        verdict, n = verify_input.verdict, trees.size
        rows = torch.arange(len(rids), device=self.device)
        count = verdict.num_accepted + 1
        nodes = rows[:, None] * n + verdict.accepted.clamp(min=0)
        verified = self._drafted
        rows = DraftRows(self._slots(batch, root_position + count), root_position, count,
                         verdict.emitted(trees).clamp(min=0), self.capture.features, nodes)
        emitted = verdict.output_tokens(trees) if rules is not None or batch.has_grammar else None
        if rules is not None:  # the next trees' roots follow this step's tokens
            rules = rules.followed_by(emitted)
        drafted, draft_seconds = self._propose(rids, rows, params, random, batch, step_began, rules, emitted)
        self._drafted = drafted
        if verified is not None:  # every tree verified was drafted by the last step (a decode step), whole
            if verified.total_tokens == 1:  # nothing was verified: no acceptance to record
                trees = verdict = None
            self._pending_record.hold(began, verified=verified, drafted=drafted, trees=trees, verdict=verdict,
                                      requests=rids, draft_seconds=draft_seconds, batch=len(rids),
                                      warming=self._quiet.warming)
        result.next_draft_input = self._next_draft_input(result.next_draft_input.bonus_tokens)
        return result

    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        """SGLang's verify step at this step's tree width (the stock one verifies --speculative-num-draft-tokens)."""
        if not isinstance(batch.spec_info, TreeVerifyInput):
            return super().verify(batch, pp_proxy_tensors=pp_proxy_tensors, grammar_barrier=grammar_barrier)
        return run_eagle_verify(
            batch, pp_proxy_tensors=pp_proxy_tensors, target_worker=self.target_worker,
            req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
            plan_stream=self.plan_stream, plan_stream_ctx=self.plan_stream_ctx, topk=batch.spec_info.topk,
            num_draft_tokens=batch.spec_info.draft_token_num, device=self.device, metadata_ready_pre_pad=False,
            finalize_tree_path=True, grammar_barrier=grammar_barrier)

    def _propose(self, rids: list, rows: DraftRows, params: SamplingParams, random: RowRandom, batch,
                 step_began: float, rules: Optional[OutputRules],
                 emitted: Optional[list[list[int]]]) -> tuple[TreeShape, float]:
        """Catch every request (``rids``, the batch's order) up on ``rows`` (the draft's KV into SGLang's draft pool)
        and keep its next tree, of the shape the budget picks (the root alone for none; ``step_began``: when the step
        began, for :class:`~eagle3_plugin.wave.QuietBatch`; ``rules``: the requests' as of the next roots, the draft
        obeying those meant for it, and their grammars at every node (:mod:`.grammars`), ``emitted`` being each
        request's tokens of this step); returns that shape and the seconds it took."""
        began = time.perf_counter()
        if self._draft_kv is None:
            self._draft_kv = _draft_store(self._draft_worker.draft_runner.token_to_kv_pool)
        joined = batch.forward_mode.is_extend() or not set(rids) <= set(self._batch_rids)
        ended = not set(self._batch_rids) <= set(rids)
        if rids != self._batch_rids:  # requests came or went: their slots may change owner, deferred entries land
            self.speculator.flush()
            self._batch_rids = rids
        wave = None
        if self.budget.auto:
            wave = self._quiet.wave(rids, lambda: self._remaining_tokens(batch), joined, ended, step_began,
                                    waiting(batch) > 0)
        shape = self.budget.shape(len(rids), seeded=bool(random.rows), wave=wave)
        self.timings.drafted(shape, self.budget.shapes)
        masked = batch.has_grammar and shape != NONE
        with (draft_grammars(batch.reqs, emitted, self.vocab_size) if masked else contextlib.nullcontext()) as grammars:
            rules = drafting_rules(rules, grammars, self.vocab_size, emitted)
            trees = self.speculator.step(self._draft_kv, rows, params, random, shape, rules)
        kept = {} if grammars is None else grammars.kept
        for row, rid in enumerate(rids):  # each request's masks go with its latest tree
            if row in kept:
                self._grammar_masks[rid] = kept[row]
            else:
                self._grammar_masks.pop(rid, None)
        self.proposed.set(trees if trees is not None else DraftTree.root_only(rows.roots), rids)
        ended_at = time.perf_counter()
        self._quiet.step_ended(ended_at)
        seconds = ended_at - began
        self.timings.draft += seconds
        return shape, seconds

    def _remaining_tokens(self, batch) -> torch.Tensor:
        """``[B]``: the most tokens each request may still emit (its ``max_new_tokens``, within the context)."""
        context = self.target_worker.model_runner.model_config.context_len
        room = [context - len(req.origin_input_ids) - len(req.output_ids) for req in batch.reqs]
        limit = [r if req.sampling_params.max_new_tokens is None
                 else min(r, req.sampling_params.max_new_tokens - len(req.output_ids))
                 for r, req in zip(room, batch.reqs)]
        return torch.tensor(limit).clamp(min=1)

    def _slots(self, batch, length: torch.Tensor) -> torch.Tensor:
        """``[B, L]``: the KV slot of each request's positions ``0 .. L - 1`` (SGLang's ``req_to_token``)."""
        table = batch.req_to_token_pool.req_to_token
        return table[batch.req_pool_indices.long(), :int(length.max())].long()

    def _next_draft_input(self, bonus_tokens: torch.Tensor) -> EagleDraftInput:
        """The round's carry-over: only the bonus tokens are ours to pass (the draft state lives in the
        speculator); SGLang's fields are shape-valid stubs so its batch filter and merge work."""
        bs = bonus_tokens.shape[0]
        return EagleDraftInput(
            bonus_tokens=bonus_tokens,
            topk_p=torch.zeros(bs, self.topk, device=self.device),
            topk_index=torch.zeros(bs, self.topk, dtype=torch.int64, device=self.device),
            hidden_states=None, num_tokens_per_req=1, num_tokens_for_logprob_per_req=1)

    def _sampling(self, batch) -> tuple[SamplingParams, RowRandom]:
        """The batch's sampling settings for the core (SGLang writes greedy as top_k = 1; it filters top-k, top-p and
        min-p jointly), and its randomness (a request with a seed draws from its own generator, but not for a prompt
        chunk's tree, which is thrown away: its draws would depend on how the prompt was chunked and cached)."""
        info = batch.sampling_info
        greedy = info.top_ks == 1
        params = SamplingParams(torch.where(greedy, 0.0, info.temperatures.view(-1).float()),
                                torch.where(greedy | (info.top_ks >= self.vocab_size), 0, info.top_ks).long(),
                                torch.where(greedy, 1.0, info.top_ps.float()), filter_order="joint",
                                min_p=info.min_ps.float() if info.need_min_p_sampling else None)
        seeded = {}
        for row, req in enumerate(batch.reqs):
            seed = req.sampling_params.sampling_seed
            if seed is not None and req is not batch.chunked_req:
                if req.rid not in self._seeded:
                    self._seeded[req.rid] = torch.Generator(device=self.device).manual_seed(int(seed))
                seeded[row] = self._seeded[req.rid]
        return params, RowRandom(self._generator, seeded)

    def _track(self, req) -> None:
        """Forget the request's tree and generator once SGLang drops the request."""
        if req.rid not in self._known:
            self._known.add(req.rid)
            weakref.finalize(req, self._forget, req.rid)

    def _forget(self, rid: str) -> None:
        self.proposed.drop([rid])
        self._grammar_masks.pop(rid, None)
        self.budget.finished([rid])
        self._seeded.pop(rid, None)
        self._known.discard(rid)


def _draft_store(pool) -> DraftKV:
    """SGLang's draft token pool (one layer, token-major ``[slots, heads, head_dim]``) as our store."""
    keys, values = pool._get_key_buffer(pool.start_layer), pool._get_value_buffer(pool.start_layer)
    if pool.layer_num != 1 or keys.dim() != 3:
        raise RuntimeError(f"eagle3-plugin expects SGLang's draft pool to hold one layer as [slots, heads, dim]; got "
                           f"{pool.layer_num} layer(s) of shape {tuple(keys.shape)}")
    return DraftKV(keys, values)


def _load_draft(path: str, target_config, dtype, layer_ids=None):
    """The draft in any format we read, checked against the target, and its capture ids (ours; ``layer_ids``
    overrides what the draft records)."""
    fmt, canonical, _ = load_source(path)
    layer_ids = layer_ids or canonical.layer_ids
    if layer_ids is None:
        layer_ids = settings.sglang_default_layer_ids(target_config.num_hidden_layers)
        logger.warning("eagle3-plugin: the %s draft at %s records no capture ids; using SGLang's default, "
                       "ours %s", fmt, path, list(layer_ids))
    draft = canonical.build(dtype)
    return draft, validate_against_target(draft, target_config, layer_ids, path)


def _input_embeddings(model: nn.Module) -> nn.Module:
    for owner in (model, getattr(model, "model", None)):
        if owner is not None and hasattr(owner, "get_input_embeddings"):
            return owner.get_input_embeddings()
    raise RuntimeError(f"{type(model).__name__}: cannot find the target's input embeddings")
