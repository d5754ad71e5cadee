"""vLLM's CPU model runner with our EAGLE-3 worker (active when ``additional_config["eagle3"]`` is set).

One engine step, for the whole batch at once (the scheduler, the KV manager and vLLM's bookkeeping are stock):

    _prepare_inputs   each request's draft tokens are its last tree, flattened (root first, topological);
                      their positions become root position + depth (:mod:`.step`)
    _build_attention_metadata   the step's tree masks ride on the attention metadata (:mod:`.tree_attention`)
    target forward    every tree request's rows in one masked attention per layer, the CPU_ATTN kernel for the rest
    _sample           core verify_tree over all rows (greedy, or recursive rejection with the draft's real
                      probabilities) -> accepted tokens + bonus, as vLLM's rejection sampler would emit them; the
                      requests' penalties, min_tokens, allowed ids, bad words and logit_bias apply at each node for
                      its path, and min_p in the target's law (:mod:`.output_rules`); the accepted paths' KV moves to
                      the slots of positions root + 1, ...
    propose           core Speculator: one draft catch-up forward on every request's new entries, then one
                      forward per tree level; the draft's KV lives in vLLM's paged cache (the layer vLLM
                      allocated for its own EAGLE drafter), so prefix caching and preemption cover it; grammar
                      requests' trees are cut to their leading paths, which obey the grammar (:mod:`.grammars`),
                      and a step of grammar requests only drafts chains (the budget's ``chains_only``)
    sample_tokens     returns the step's output with the draft tokens attached (:mod:`.draft_handoff`)

vLLM counts accepted tokens as it does for chains (num_computed_tokens, spec-decode metrics: a tree of N nodes
is N - 1 draft tokens, per-position acceptance is per depth). Trees the scheduler cut short (length limits,
token budget) are verified as the prefix it kept, which is still a tree.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict
from typing import Optional

import torch
from torch import nn

from ..budget import NONE, PendingRecord
from ..checkpoint import load_draft
from ..config import Eagle3Config
from ..output_rules import drafting_rules
from ..proposed_trees import ProposedTrees
from ..rng import RowRandom
from ..speculator import Speculator, TreeShape
from ..timings import PluginTimings
from ..wave import QuietBatch
from . import draft_handoff, paged_kv, tree_attention
from .grammars import WorkerGrammars
from .output_rules import builtin_logits_processors, output_rules
from .seeded_prefill import SeededPrefillFix
from .speculative import ADDITIONAL_CONFIG_KEY
from .step import Step, draft_entries, draft_rows, remaining_tokens, sampling_params
from .tensor_parallel import ShapeBroadcast, full_draft_heads, rank_budget, step_guard

from vllm.utils.torch_utils import PIN_MEMORY
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput, SamplerOutput
from vllm.v1.worker.cpu_model_runner import CPUModelRunner


def read_timings(worker) -> dict:
    """For ``LLM.collective_rpc``: the worker's :class:`PluginTimings` as a dict."""
    return asdict(worker.model_runner.timings)


class TreeSpeculationRunner(SeededPrefillFix, CPUModelRunner):
    def __init__(self, vllm_config, device):
        super().__init__(vllm_config, device)
        settings = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        self.eagle3 = Eagle3Config.from_dict(settings, source="additional_config.eagle3") if settings else None
        self.timings = PluginTimings()
        self._step: Step | None = None
        self._pending = ProposedTrees()
        self._step_guard = contextlib.nullcontext  # what each step runs inside (:func:`.tensor_parallel.step_guard`)
        if self.eagle3 is None:
            return
        if self.speculative_config is None or self.num_spec_tokens != self.eagle3.total_tokens - 1:
            raise RuntimeError("additional_config.eagle3 needs speculative_config with num_speculative_tokens "
                               "= total_tokens - 1 (pass our config as speculative_config instead)")
        if self.use_async_scheduling:
            raise RuntimeError("eagle3-plugin's worker runs with async scheduling off (--no-async-scheduling)")
        parallel = vllm_config.parallel_config
        if (parallel.pipeline_parallel_size, parallel.data_parallel_size) != (1, 1):
            raise RuntimeError("eagle3-plugin's worker runs with pipeline and data parallel size 1 (tensor parallelism "
                               "is supported)")
        if self.model_config.logprobs_mode not in ("raw_logprobs", "raw_logits"):
            raise RuntimeError(f"eagle3-plugin's worker returns raw logprobs; --logprobs-mode "
                               f"{self.model_config.logprobs_mode} is not supported")
        batch = self.input_batch  # empty yet; vLLM carries its processors into any batch it rebuilds
        batch.logitsprocs = builtin_logits_processors(vllm_config, self.device, PIN_MEMORY)
        batch.sampling_metadata = batch._make_sampling_metadata()
        self._grammars = WorkerGrammars(vllm_config)  # what grammar requests' drafts obey

    # -- model and memory --------------------------------------------------------------------------

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        if self.eagle3 is None:
            return
        draft = load_draft(self.eagle3.draft, dtype=self.model_config.dtype).eval()
        with torch.inference_mode():
            table = self.model.embed_input_ids(torch.arange(draft.config.vocab_size, device=self.device))
        draft.attach_embedding(nn.Embedding.from_pretrained(table.detach().clone(), freeze=True))
        self.speculator = Speculator(draft, self.eagle3)
        self._shape_broadcast = ShapeBroadcast.needed(self.eagle3)
        self._step_guard = step_guard()
        self.budget = rank_budget(self.speculator, self._shape_broadcast, self.model_config.dtype, self.device)
        self._pending_record = PendingRecord(self.budget)  # the last step's record, until the next step starts
        self._drafted: TreeShape = NONE  # the shape of the trees the next step verifies
        self._quiet = QuietBatch()
        self._generator = torch.Generator(device=self.device).manual_seed(self.model_config.seed or 0)
        from vllm.model_executor.layers.attention import Attention
        self._target_layers = {m.layer_name for m in self.model.modules() if isinstance(m, Attention)}
        names = sorted(self.drafter._draft_attn_layer_names)
        if len(names) != 1:
            raise RuntimeError(f"eagle3-plugin expects vLLM's EAGLE-3 drafter to have one attention layer, got {names}")
        self._draft_layer = names[0]
        full_draft_heads(self.compilation_config.static_forward_context[self._draft_layer],
                         draft.config.num_key_value_heads)

    def initialize_kv_cache(self, kv_cache_config, *args, **kwargs) -> None:
        super().initialize_kv_cache(kv_cache_config, *args, **kwargs)
        if self.eagle3 is None:
            return
        groups = kv_cache_config.kv_cache_groups
        self._draft_group = next(i for i, g in enumerate(groups) if self._draft_layer in g.layer_names)
        self._target_group = next(i for i, g in enumerate(groups) if self._target_layers & set(g.layer_names))
        context = self.compilation_config.static_forward_context
        self._draft_kv = paged_kv.draft_store(context[self._draft_layer].kv_cache)
        self._target_kv = [paged_kv.key_value_caches(context[name].kv_cache) for name in sorted(self._target_layers)]

    # -- one step --------------------------------------------------------------------------------

    def execute_model(self, *args, **kwargs):
        with self._step_guard():
            return super().execute_model(*args, **kwargs)

    def _update_states(self, scheduler_output):
        if self.eagle3 is not None:
            self._pending.drop(scheduler_output.finished_req_ids)
            self.budget.finished(scheduler_output.finished_req_ids)
            if scheduler_output.finished_req_ids or scheduler_output.preempted_req_ids:
                began = time.perf_counter()  # their blocks may change owner this step: deferred entries land first
                self.speculator.flush()
                self.timings.draft += time.perf_counter() - began
        return super()._update_states(scheduler_output)

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        if self.eagle3 is None:
            return super()._prepare_inputs(scheduler_output, num_scheduled_tokens)
        if scheduler_output.scheduled_spec_decode_tokens:
            result = super()._prepare_inputs(scheduler_output, num_scheduled_tokens)
        else:
            result = self._prepare_inputs_without_drafts(scheduler_output, num_scheduled_tokens)
        began = time.perf_counter()
        self._step = Step.build(self, scheduler_output, num_scheduled_tokens, self._pending)
        self._step.began = began
        self._pending_record.release(began if self._step.continues_decoding else None)
        self.timings.steps += 1
        self.timings.prepare += time.perf_counter() - began
        return result

    def _prepare_inputs_without_drafts(self, scheduler_output, num_scheduled_tokens):
        """A step without draft tokens (after one that drafted nothing, or prompts only), prepared as vLLM prepares
        one without speculation: the same logits rows (each row's last token) without the spec-decode metadata of
        zero drafts (~0.25 ms a step on this CPU); ``_sample`` gets None for it, as it expects of such a step."""
        speculative_config, self.speculative_config = self.speculative_config, None
        try:
            return super()._prepare_inputs(scheduler_output, num_scheduled_tokens)
        finally:
            self.speculative_config = speculative_config

    def _build_attention_metadata(self, *args, **kwargs):
        attn_metadata, common = super()._build_attention_metadata(*args, **kwargs)
        step = self._step if self.eagle3 is not None else None
        if step is not None and step.tree_attention is not None:
            per_layer = attn_metadata if isinstance(attn_metadata, dict) else {}
            for name in self._target_layers:
                if name in per_layer:
                    setattr(per_layer[name], tree_attention.METADATA_ATTRIBUTE, step.tree_attention)
        return attn_metadata, common

    def _sample(self, logits, spec_decode_metadata):
        if self.eagle3 is None:
            return super()._sample(logits, spec_decode_metadata)
        step = self._step
        if step.tree_attention is not None:
            self.timings.tree_attention += step.tree_attention.seconds
        began = time.perf_counter()
        metadata, vocab_size = self.input_batch.sampling_metadata, self.input_batch.vocab_size
        step.rules = output_rules(metadata, step.num_reqs, vocab_size)  # for verification and the next trees
        if not step.has_trees:  # nothing to verify: vLLM's sampler decides, as without speculation (its rejection
            output = super()._sample(logits, None)  # sampler would draw the same bonus tokens, at more cost)
            step.sampled(output.sampled_token_ids[:, 0].long())
            self.timings.verify += time.perf_counter() - began
            return output
        random = RowRandom(self._generator, metadata.generators)
        step.verify(logits, sampling_params(metadata, step.num_reqs, vocab_size), self.eagle3.tree_sampler, random)
        self._compact(step)
        logprobs = None
        if metadata.max_num_logprobs is not None or metadata.logprob_token_ids:
            logprobs = self._logprobs(logits, step, metadata.max_num_logprobs, metadata.logprob_token_ids)
        self.timings.verify += time.perf_counter() - began
        return SamplerOutput(sampled_token_ids=step.emitted, logprobs_tensors=logprobs)

    def _compact(self, step: Step) -> None:
        """Move the accepted paths' target KV (tree slots ``start + node``) to ``start + depth``. The slot mapping
        is still this step's: vLLM recomputes it only in the next ``_prepare_inputs``."""
        src, dst = step.moves()
        if src.numel() == 0:
            return
        slots = self.input_batch.block_table.block_tables[self._target_group].slot_mapping.cpu
        paged_kv.move_slots(self._target_kv, slots[src].long(), slots[dst].long())

    def sample_tokens(self, grammar_output):
        """vLLM's, with the step's draft tokens attached to its output (:mod:`.draft_handoff`)."""
        with self._step_guard():
            output = super().sample_tokens(grammar_output)
        fresh = isinstance(output, ModelRunnerOutput) and output is not EMPTY_MODEL_RUNNER_OUTPUT  # not a shared one
        if self.eagle3 is not None and fresh:
            draft_handoff.attach(output, self.take_draft_token_ids())
        return output

    def _logprobs(self, logits, step: Step, num_logprobs: Optional[int], token_ids: Optional[dict]):
        """vLLM's logprobs tensors for the emitted tokens (row-major over ``step.emitted``, -1 padded), each from
        the target's raw logits at the node that predicted it (vLLM's default ``raw_logprobs``). As vLLM's sampler:
        where any request names ``logprob_token_ids`` (``{row: ids}``), each emitted token's named ids come back,
        for every request of the step, in place of the top ``num_logprobs``."""
        rows = logits[step.emitted_logit_rows().flatten()].float()
        values = rows if self.sampler.logprobs_mode == "raw_logits" else self.sampler.compute_logprobs(rows)
        emitted = step.emitted.flatten().clamp(min=0).long()
        if token_ids:
            width = step.emitted.shape[1]
            per_token = {row * width + j: ids for row, ids in token_ids.items() for j in range(width)}
            return self.sampler.gather_specific_token_logprobs(values, per_token, emitted)
        k = num_logprobs if num_logprobs >= 0 else values.shape[-1]
        return self.sampler.gather_logprobs(values, k, emitted)

    def _input_fits_in_drafter(self, common_attn_metadata) -> bool:
        if self.eagle3 is None:
            return super()._input_fits_in_drafter(common_attn_metadata)
        return common_attn_metadata is not None  # our draft has no length limit; the scheduler trims trees

    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                                sample_hidden_states, aux_hidden_states, *args, **kwargs):
        if self.eagle3 is None:
            return super().propose_draft_token_ids(scheduler_output, sampled_token_ids, sampling_metadata,
                                                   hidden_states, sample_hidden_states, aux_hidden_states,
                                                   *args, **kwargs)
        began = time.perf_counter()
        step, batch = self._step, self.input_batch
        table = batch.block_table.block_tables[self._draft_group]
        wave = None
        if self.budget.auto:
            wave = self._quiet.wave(step.req_ids, lambda: remaining_tokens(self, step.num_reqs),
                                    step.joined or not step.decode_only, step.ended, step.began, step.waiting)
        shape = self.budget.shape(step.num_reqs, seeded=bool(sampling_metadata.generators), wave=wave,
                                  chains_only=step.chains_only)
        if self._shape_broadcast is not None:
            shape = self._shape_broadcast.agree(shape)
        self.timings.drafted(shape, self.budget.shapes)
        captured = (step, self, torch.cat(aux_hidden_states, dim=-1), table.block_table.cpu[:step.num_reqs],
                    table.block_size)
        if shape == NONE:
            self.speculator.store(self._draft_kv, draft_entries(*captured, table.slot_mapping.cpu))
            tree = None
        else:
            params = sampling_params(sampling_metadata, step.num_reqs, batch.vocab_size)
            rules = step.rules  # vLLM lists this step's tokens among the output after drafting
            grammar_rows = [] if step.structured is None else torch.nonzero(step.structured)[:, 0].tolist()
            emitted = step.verdict.output_tokens(step.tree) if rules is not None or grammar_rows else None
            if rules is not None:
                rules = rules.followed_by(emitted)
            with self._grammars.drafting(self.requests, step.req_ids, grammar_rows, emitted) as grammars:
                rules = drafting_rules(rules, grammars, batch.vocab_size, emitted)
                tree = self.speculator.step(self._draft_kv, draft_rows(*captured), params,
                                            RowRandom(self._generator, sampling_metadata.generators), shape, rules)
        self._step = None
        counts = None  # each row's nodes, where grammar rows are cut to their leading path
        if tree is not None and step.structured is not None and shape.top_k > 1:
            tree, counts = tree.leading_paths(step.structured)  # vLLM's grammars mask a chain of drafts only
        self._pending.set(tree, batch.req_ids)
        if tree is None:
            drafts = [[] for _ in range(step.num_reqs)]
        else:
            drafts = tree.tokens[:, 1:].tolist()
            if counts is not None:
                drafts = [row[:count - 1] for row, count in zip(drafts, counts.tolist())]
            for row in step.prefilling_rows():
                drafts[row] = []
        ended = time.perf_counter()
        self._quiet.step_ended(ended)
        self.timings.draft += ended - began
        if self._pending_record.wanted:
            trees = verdict = requests = None
            if self._drafted.total_tokens > 1:
                whole = step.node_count == self._drafted.total_tokens  # trees the scheduler cut tell less of acceptance
                if step.grammar_chains is not None:  # but a grammar's cut is what its row accepts (see propose's
                    whole |= step.grammar_chains  # leading paths and vLLM's grammar check)
                if bool(whole.any()):
                    trees, verdict = step.tree.select(whole), step.verdict.select(whole)
                    requests = [step.req_ids[row] for row in torch.nonzero(whole)[:, 0].tolist()]
            self._pending_record.hold(step.began, verified=self._drafted, drafted=shape, trees=trees, verdict=verdict,
                                      requests=requests, decode_only=step.decode_only, draft_seconds=ended - began,
                                      batch=step.num_reqs, warming=self._quiet.warming)
        self._drafted = shape
        return drafts


def install() -> None:
    """The CPU worker builds its (V1) runner by this name; our subclass is inert without our config."""
    from vllm.v1.worker import cpu_worker
    cpu_worker.CPUModelRunner = TreeSpeculationRunner
