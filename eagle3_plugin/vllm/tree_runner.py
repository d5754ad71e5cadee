"""vLLM's CPU model runner with our EAGLE-3 tree worker (active when ``additional_config["eagle3"]`` is set).

One engine step, per request in the batch (the scheduler and vLLM's bookkeeping are untouched):

    _prepare_inputs   the request's draft tokens are our last tree, flattened (root first, topological);
                      positions become root position + depth; the tree masks go to tree attention
    target forward    CPU_ATTN kernel, then tree rows redone in plain torch (tree_attention)
    _sample           core verify_tree (greedy, or recursive rejection with the draft's real probabilities)
                      -> accepted tokens + bonus, as vLLM's rejection sampler would emit them; the accepted
                      path's KV moves to the slots of positions root + 1, root + 2, ... (paged_kv)
    propose           core RequestSpeculator: draft catch-up on the accepted path, next tree

vLLM then counts accepted tokens as it does for chains (num_computed_tokens, spec-decode metrics: a tree
of N nodes is N - 1 draft tokens, per-position acceptance is per depth). Trees the scheduler cut short
(length limits, token budget) are verified as the prefix it kept, which is still a tree.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from ..checkpoint import load_draft
from ..config import Eagle3Config
from ..requests import RequestSpeculator
from ..sampler import SamplingParams, Verdict, sample_tokens, verify_tree
from ..tree import DraftTree
from . import paged_kv, tree_attention
from .speculative import ADDITIONAL_CONFIG_KEY

from vllm.v1.outputs import SamplerOutput
from vllm.v1.worker.cpu_model_runner import CPUModelRunner


class UnsupportedRequest(RuntimeError):
    pass


@dataclass
class PluginTimings:
    """Seconds the tree worker adds to engine steps, by phase (read with :func:`read_timings`)."""

    steps: int = 0
    prepare: float = 0.0  # depth positions, tree masks
    tree_attention: float = 0.0  # tree rows redone in torch, all layers
    verify: float = 0.0  # sampler + KV compaction
    draft: float = 0.0  # draft catch-up + next tree

    def per_step_ms(self) -> dict:
        n = max(self.steps, 1)
        return {k: 1e3 * v / n for k, v in asdict(self).items() if k != "steps"}


@dataclass
class _RowStep:
    """One batch row in the current engine step: where its query tokens sit, the tree they verify (None for
    prompt chunks and plain decodes), and what ``_sample`` decided."""

    base: int  # the request's position of its first query token (the root, for a tree)
    start: int  # index of that token in the step's flat token list
    count: int  # its query tokens
    tree: DraftTree | None = None
    verdict: Verdict | None = None
    emitted: list[int] = field(default_factory=list)


def read_timings(worker) -> dict:
    """For ``LLM.collective_rpc``: the worker's :class:`PluginTimings` as a dict."""
    return asdict(worker.model_runner.timings)


class TreeSpeculationRunner(CPUModelRunner):
    def __init__(self, vllm_config, device):
        super().__init__(vllm_config, device)
        settings = (vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        self.eagle3 = Eagle3Config.from_dict(settings, source="additional_config.eagle3") if settings else None
        self._rows: list[_RowStep] = []  # by batch row, for the current step
        self._tree_batch = None
        self.timings = PluginTimings()
        if self.eagle3 is not None:
            if self.speculative_config is None or self.num_spec_tokens != self.eagle3.total_tokens - 1:
                raise RuntimeError("additional_config.eagle3 needs speculative_config with num_speculative_tokens "
                                   "= total_tokens - 1 (pass our config as speculative_config instead)")
            if self.cache_config.enable_prefix_caching or self.use_async_scheduling:
                raise RuntimeError("eagle3-plugin's tree worker needs prefix caching and async scheduling off")
            if self.model_config.logprobs_mode not in ("raw_logprobs", "raw_logits"):
                raise RuntimeError(f"eagle3-plugin's tree worker returns raw logprobs; --logprobs-mode "
                                   f"{self.model_config.logprobs_mode} is not supported")

    # -- model -------------------------------------------------------------------------------------

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        if self.eagle3 is None:
            return
        dtype = self.model_config.dtype
        draft = load_draft(self.eagle3.draft, dtype=dtype).eval()
        vocab = draft.config.vocab_size
        with torch.inference_mode():
            table = self.model.embed_input_ids(torch.arange(vocab, device=self.device)).detach().clone()
        draft.attach_embedding(nn.Embedding.from_pretrained(table, freeze=True))
        self.speculator = RequestSpeculator(draft, self.eagle3, dtype, self.device)
        self._generator = torch.Generator(device=self.device).manual_seed(self.model_config.seed or 0)
        from vllm.model_executor.layers.attention import Attention
        self._target_layers = {m.layer_name for m in self.model.modules() if isinstance(m, Attention)}

    # -- one step --------------------------------------------------------------------------------

    def _update_states(self, scheduler_output):
        result = super()._update_states(scheduler_output)
        if self.eagle3 is not None:
            for req_id in scheduler_output.finished_req_ids:
                self.speculator.drop(req_id)
        return result

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        result = super()._prepare_inputs(scheduler_output, num_scheduled_tokens)
        if self.eagle3 is None:
            return result
        began = time.perf_counter()
        if scheduler_output.has_structured_output_requests and self.eagle3.top_k > 1:
            raise UnsupportedRequest("eagle3-plugin tree speculation does not support structured output (vLLM's "
                                     "grammar masks draft tokens as a chain); use a chain config")
        batch = self.input_batch
        starts = self.query_start_loc.np
        self._rows, masks = [], {}
        for row, req_id in enumerate(batch.req_ids):
            base, start = int(batch.num_computed_tokens_cpu[row]), int(starts[row])
            step = _RowStep(base, start, int(num_scheduled_tokens[row]))
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(req_id)
            if drafts:
                tree = self.speculator.pending_tree(req_id)
                n = len(drafts) + 1
                if tree is None or tree.tokens[0, 1:n].tolist() != list(drafts):
                    raise RuntimeError(f"request {req_id}: the scheduled draft tokens are not our last tree")
                tree = tree.prefix(n)
                if not _is_path(tree):  # a path is causal in flat order: the kernel is already right
                    self.positions[start:start + n] = base + tree.depths[0]
                    masks[row] = tree.ancestor_mask()[0]
                step.tree = tree
            self._rows.append(step)
        self._tree_batch = tree_attention.TreeBatch(masks)
        tree_attention.set_current(self._tree_batch)
        self.timings.steps += 1
        self.timings.prepare += time.perf_counter() - began
        return result

    def _sample(self, logits, spec_decode_metadata):
        if self.eagle3 is None:
            return super()._sample(logits, spec_decode_metadata)
        tree_attention.set_current(None)
        self.timings.tree_attention += self._tree_batch.seconds
        began = time.perf_counter()
        metadata = self.input_batch.sampling_metadata
        _check_supported(metadata)
        num_reqs = self.input_batch.num_reqs
        counts = spec_decode_metadata.num_draft_tokens if spec_decode_metadata else [0] * num_reqs
        width = max(counts) + 1
        out = torch.full((num_reqs, width), -1, dtype=torch.int32)
        logit_rows = torch.zeros(num_reqs, width, dtype=torch.long)  # the logits row each emitted token came from
        first = 0
        for row, step in enumerate(self._rows):
            n = counts[row] + 1
            row_logits = logits[first:first + n].float()
            first += n
            params = _params(metadata, row, self.device)
            generator = metadata.generators.get(row, self._generator)
            if step.tree is None:
                step.emitted = sample_tokens(row_logits[-1:], params, generator).tolist()
                logit_rows[row, 0] = first - 1
            else:
                step.verdict = verify_tree(step.tree, row_logits[None], params, self.eagle3.tree_sampler, generator)
                step.emitted = step.verdict.output_tokens(step.tree)[0]
                path = step.verdict.accepted[0, :int(step.verdict.num_accepted[0]) + 1]
                logit_rows[row, :path.shape[0]] = first - n + path
                self._compact(step.start, path)
            out[row, :len(step.emitted)] = torch.tensor(step.emitted, dtype=torch.int32)
        logprobs = None
        if metadata.max_num_logprobs is not None:
            logprobs = self._logprobs(logits, logit_rows, out, metadata.max_num_logprobs)
        self.timings.verify += time.perf_counter() - began
        return SamplerOutput(sampled_token_ids=out, logprobs_tensors=logprobs)

    def _logprobs(self, logits, logit_rows, tokens, num_logprobs: int):
        """vLLM's logprobs tensors for the emitted tokens (row-major over ``tokens [num_reqs, width]``, -1 padded),
        each from the target's raw logits at the node that predicted it (vLLM's default ``raw_logprobs``)."""
        rows = logits[logit_rows.flatten().to(logits.device)].float()
        values = rows if self.sampler.logprobs_mode == "raw_logits" else self.sampler.compute_logprobs(rows)
        k = num_logprobs if num_logprobs >= 0 else values.shape[-1]
        return self.sampler.gather_logprobs(values, k, tokens.flatten().clamp(min=0).long().to(values.device))

    def _compact(self, start: int, path: torch.Tensor) -> None:
        """Move the accepted path's target KV (tree slots ``start + node``) to ``start + depth``. The slot
        mapping is still this step's: vLLM recomputes it only in the next ``_prepare_inputs``."""
        depths = torch.arange(path.shape[0])
        moved = path != depths
        if not bool(moved.any()):
            return
        context = self.compilation_config.static_forward_context
        for group, table in zip(self.kv_cache_config.kv_cache_groups, self.input_batch.block_table.block_tables):
            slots = table.slot_mapping.cpu
            src, dst = slots[start + path[moved]], slots[start + depths[moved]]
            for name in group.layer_names:
                if name in self._target_layers:
                    paged_kv.move_slots(context[name].kv_cache, src, dst)

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
        features = torch.cat(aux_hidden_states, dim=-1)
        batch = self.input_batch
        drafts = []
        for row, (req_id, step) in enumerate(zip(batch.req_ids, self._rows)):
            start, count, base, emitted = step.start, step.count, step.base, step.emitted
            if step.tree is not None:
                self.speculator.accept(req_id, step.verdict, features[start:start + count])
            else:
                prompt_done = not self.discard_request_mask.np[row]
                after_last = emitted[-1] if prompt_done else int(batch.token_ids_cpu[row, base + count])
                next_tokens = torch.cat([self.input_ids.cpu[start + 1:start + count].long(),
                                         torch.tensor([after_last])])
                self.speculator.extend(req_id, base, next_tokens, features[start:start + count])
                if not prompt_done:
                    drafts.append([])
                    continue
            params = _params(sampling_metadata, row, self.device)
            generator = sampling_metadata.generators.get(row, self._generator)
            tree = self.speculator.propose(req_id, emitted[-1], params, generator)
            drafts.append(tree.tokens[0, 1:].tolist())
        self.timings.draft += time.perf_counter() - began
        return drafts


def _is_path(tree) -> bool:
    return bool((tree.depths[0] == torch.arange(tree.size)).all())


def _params(metadata, row: int, device) -> SamplingParams:
    temperature = 0.0 if metadata.temperature is None else float(metadata.temperature[row])
    top_k = 0 if metadata.top_k is None else int(metadata.top_k[row])
    top_p = 1.0 if metadata.top_p is None else float(metadata.top_p[row])
    return SamplingParams.uniform(1, temperature, top_k, top_p, device=device)


def _check_supported(metadata) -> None:
    """Settings our sampler does not apply never reach it: :mod:`.admission` refuses them (HTTP 400). Here, one
    arriving anyway is our bug, and stops the engine rather than being ignored."""
    unsupported = []
    if not metadata.no_penalties:
        unsupported.append("presence/frequency/repetition penalties")
    if metadata.allowed_token_ids_mask is not None:
        unsupported.append("allowed_token_ids")
    if metadata.bad_words_token_ids:
        unsupported.append("bad_words")
    if unsupported:
        raise UnsupportedRequest("eagle3-plugin tree speculation does not support " + ", ".join(unsupported))


def install() -> None:
    """The CPU worker builds its (V1) runner by this name; our subclass is inert without our config."""
    from vllm.v1.worker import cpu_worker
    cpu_worker.CPUModelRunner = TreeSpeculationRunner
