"""SGLang's EAGLE worker with our draft tree, strict sampler and capture (installed in place of ``EAGLEWorkerV2``).

With ``--speculative-algorithm EAGLE3`` one scheduler step is, per batch (the scheduler, the target's
forward and SGLang's KV bookkeeping are untouched):

    prefill   target forward (our capture hooks its layers) -> the core's RequestSpeculator catches each
              request's draft up on the prompt tokens it just processed
    decode    RequestSpeculator proposes each request's tree -> TreeVerifyInput -> SGLang's
              run_eagle_verify (target forward over the trees, our sampler via eagle_sample, KV compaction
              of the accepted path) -> draft catch-up on the accepted path

SGLang's own draft worker is still constructed (the scheduler sizes pools and reads attributes through it)
but never runs. Other algorithms (EAGLE, STANDALONE) get the stock worker unchanged.
"""

from __future__ import annotations

import logging
import weakref

import torch
from torch import nn

from ..checkpoint import validate_against_target
from ..convert import load_source
from ..requests import RequestSpeculator
from ..sampler import SamplingParams
from . import capture, settings
from .verify import build_verify_input

from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.runtime_context import get_spec
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_utils import TreeMaskMode, _eagle_prefill_tail_tokens, default_tree_mask_mode
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
        self.speculator = RequestSpeculator(draft.to(self.device), self.eagle3, dtype, self.device)
        self.vocab_size = vocab
        self._generator = torch.Generator(device=self.device).manual_seed(server_args.random_seed or 0)
        self._seeded: dict[str, torch.Generator] = {}
        self._known: set[str] = set()
        logger.info("eagle3-plugin worker: %s, capture ids %s (ours), tree sampler %s", self.eagle3.mode,
                    list(layer_ids), self.eagle3.tree_sampler)

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        if self.eagle3 is None:
            return super().forward_batch_generation(batch, on_publish, grammar_barrier, pp_proxy_tensors)
        if batch.forward_mode.is_idle():
            raise NotImplementedError("eagle3-plugin's SGLang worker does not run idle (DP) batches")
        with torch.inference_mode():
            if batch.forward_mode.is_extend():
                result = self._prefill(batch)
            else:
                result = self._decode(batch, grammar_barrier)
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        return result

    def _prefill(self, batch):
        result = self.target_worker.forward_batch_generation(batch, capture_hidden_mode=CaptureHiddenMode.NULL)
        features = self.capture.features
        if features.shape[0] != len(batch.input_ids):
            raise RuntimeError(f"captured {features.shape[0]} tokens, the prefill ran {len(batch.input_ids)}")
        tails = _eagle_prefill_tail_tokens(batch, result.next_token_ids).tolist()
        first = 0
        for req, start, count, tail in zip(batch.reqs, batch.prefix_lens, batch.extend_lens, tails):
            self._track(req)
            next_tokens = torch.cat([batch.input_ids[first + 1:first + count].long(), torch.tensor([tail])])
            self.speculator.extend(req.rid, start, next_tokens, features[first:first + count])
            first += count
        result.new_seq_lens = batch.seq_lens
        result.next_draft_input = self._next_draft_input(result.next_token_ids)
        return result

    def _decode(self, batch, grammar_barrier):
        roots = batch.spec_info.bonus_tokens.tolist()
        rows = [self._sampling(req) for req in batch.reqs]
        trees = [self.speculator.propose(req.rid, root, params, generator)
                 for req, root, (params, generator) in zip(batch.reqs, roots, rows)]
        verify_input = build_verify_input(
            trees, batch.seq_lens, params=[p for p, _ in rows], generators=[g for _, g in rows],
            method=self.eagle3.tree_sampler, vocab_size=self.vocab_size, num_steps=self.speculative_num_steps,
            topk=self.topk, num_draft_tokens=self.speculative_num_draft_tokens)
        batch.spec_info = verify_input
        result = self.verify(batch, grammar_barrier=grammar_barrier)
        n = self.speculative_num_draft_tokens
        features = self.capture.features
        for row, (req, verdict) in enumerate(zip(batch.reqs, verify_input.verdicts)):
            self.speculator.accept(req.rid, verdict, features[row * n:(row + 1) * n])
        result.next_draft_input = self._next_draft_input(result.next_draft_input.bonus_tokens)
        return result

    def _next_draft_input(self, bonus_tokens: torch.Tensor) -> EagleDraftInput:
        """The round's carry-over: only the bonus tokens are ours to pass (the draft state lives in the
        speculator); SGLang's fields are shape-valid stubs so its batch filter and merge work."""
        bs = bonus_tokens.shape[0]
        return EagleDraftInput(
            bonus_tokens=bonus_tokens,
            topk_p=torch.zeros(bs, self.topk, device=self.device),
            topk_index=torch.zeros(bs, self.topk, dtype=torch.int64, device=self.device),
            hidden_states=None, num_tokens_per_req=1, num_tokens_for_logprob_per_req=1)

    def _sampling(self, req) -> tuple[SamplingParams, torch.Generator]:
        """The request's sampling settings for the core sampler (SGLang writes greedy as top_k = 1)."""
        sp = req.sampling_params
        if sp.top_k == 1:
            params = SamplingParams.uniform(1, 0.0, device=self.device)
        else:
            top_k = 0 if sp.top_k >= self.vocab_size else int(sp.top_k)
            params = SamplingParams.uniform(1, float(sp.temperature), top_k, float(sp.top_p), device=self.device)
        if sp.sampling_seed is None:
            return params, self._generator
        if req.rid not in self._seeded:
            self._seeded[req.rid] = torch.Generator(device=self.device).manual_seed(int(sp.sampling_seed))
        return params, self._seeded[req.rid]

    def _track(self, req) -> None:
        """Free the request's draft state once SGLang drops the request."""
        if req.rid not in self._known:
            self._known.add(req.rid)
            weakref.finalize(req, self._forget, req.rid)

    def _forget(self, rid: str) -> None:
        self.speculator.drop(rid)
        self._seeded.pop(rid, None)
        self._known.discard(rid)


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
