"""Which SGLang versions we support, and a check of every SGLang internal the plugin touches.

SGLang only logs a plugin that fails, so the check runs in our entry point and its error stops the
process (see :mod:`.plugin`): an unsupported version never serves with half of our hooks installed.
"""

from __future__ import annotations

from ..internals import check_engine

SUPPORTED_VERSIONS = ("0.5.23",)

_SPEC = "sglang.srt.speculative"
REQUIRED_INTERNALS = (
    ("sglang.srt.plugins.hook_registry", "HookRegistry.register", ("target", "hook", "hook_type")),
    ("sglang.srt.plugins.hook_registry", "HookRegistry.apply_hooks", None),
    ("sglang.srt.plugins.hook_registry", "HookRegistry._patched", None),
    ("sglang.srt.plugins.hook_registry", "HookType.REPLACE", None),
    # server arguments: our eagle3.json, radix cache off
    ("sglang.srt.arg_groups.speculative_hook", "handle_speculative_decoding", ("server_args",)),
    ("sglang.srt.arg_groups.overrides", "declare_resolution", ("server_args", "source")),
    ("sglang.srt.arg_groups.model_override_base", "resolving_view", ("server_args",)),
    ("sglang.srt.server_args", "ServerArgs",
     ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
      "speculative_num_draft_tokens", "disable_radix_cache", "random_seed", "tp_size", "pp_size", "dp_size")),
    # the scheduler's queue, handed to the worker (closed batches)
    ("sglang.srt.managers.scheduler", "Scheduler.run_batch", ("batch",)),
    # request admission
    ("sglang.srt.managers.tokenizer_manager", "TokenizerManager._validate_one_request", ("obj", "input_ids")),
    ("sglang.srt.managers.io_struct", "GenerateReqInput",
     ("sampling_params", "custom_logit_processor", "return_logprob", "top_logprobs_num")),
    # capture: SGLang's own aux capture is switched off for the target, ours hooks its layers
    ("sglang.srt.model_executor.model_runner_components.attention_backend_setup",
     "configure_aux_hidden_state_capture", ("model", "eagle_use_aux_hidden_state")),
    # the worker
    (f"{_SPEC}.eagle_worker_v2", "EAGLEWorkerV2.forward_batch_generation",
     ("batch", "on_publish", "grammar_barrier", "pp_proxy_tensors")),
    (f"{_SPEC}.eagle_worker_v2", "EAGLEWorkerV2.verify", ("batch", "pp_proxy_tensors", "grammar_barrier")),
    (f"{_SPEC}.eagle_worker_v2", "EAGLEWorkerV2.__init__", ("server_args", "gpu_id", "nccl_port", "target_worker")),
    ("sglang.srt.managers.tp_worker", "TpModelWorker.forward_batch_generation", ("batch", "capture_hidden_mode")),
    (f"{_SPEC}.eagle_utils", "_eagle_prefill_tail_tokens", ("batch", "next_token_ids")),
    (f"{_SPEC}.eagle_utils", "default_tree_mask_mode", ()),
    (f"{_SPEC}.eagle_utils", "TreeMaskMode.QLEN_ONLY", None),
    ("sglang.srt.runtime_context", "get_spec", ()),
    (f"{_SPEC}.eagle_utils", "eagle_sample", ("verify_input", "batch", "logits_output", "grammar_mask")),
    (f"{_SPEC}.eagle_worker_common", "run_eagle_verify",
     ("batch", "target_worker", "req_to_token_pool", "token_to_kv_pool_allocator", "plan_stream", "plan_stream_ctx",
      "topk", "num_draft_tokens", "device", "metadata_ready_pre_pad", "finalize_tree_path", "pp_proxy_tensors",
      "grammar_barrier")),
    # a verify step of any width up to the allocated one: SGLang's output stride and attention read it per step
    ("sglang.srt.managers.utils", "GenerationBatchResult", ("speculative_num_draft_tokens",)),
    (f"{_SPEC}.eagle_info", "EagleVerifyInput",
     ("draft_token", "custom_mask", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling",
      "retrieve_cum_len", "spec_steps", "topk", "draft_token_num", "capture_hidden_mode", "seq_lens_sum",
      "seq_lens_cpu")),
    (f"{_SPEC}.eagle_info", "EagleDraftInput",
     ("bonus_tokens", "topk_p", "topk_index", "hidden_states", "num_tokens_per_req",
      "num_tokens_for_logprob_per_req")),
    ("sglang.srt.model_executor.forward_batch_info", "CaptureHiddenMode.NULL", None),
    ("sglang.srt.managers.schedule_batch", "ScheduleBatch",
     ("reqs", "input_ids", "seq_lens", "prefix_lens", "extend_lens", "sampling_info", "forward_mode", "chunked_req")),
    # a seeded request's first token (.first_tokens): SGLang's prefill draw, redrawn from the request's generator
    ("sglang.srt.layers.sampler", "Sampler._sample_from_probs", ("probs", "sampling_info")),
    ("sglang.srt.sampling.sampling_params", "SamplingParams",
     ("temperature", "top_p", "top_k", "min_p", "sampling_seed", "frequency_penalty", "presence_penalty",
      "repetition_penalty", "min_new_tokens", "stop_token_ids")),
    # penalties, min_new_tokens, logit_bias (.output_rules) and min_p: the batch's, each request's output and stop ids
    ("sglang.srt.sampling.sampling_batch_info", "SamplingBatchInfo",
     ("acc_additive_penalties", "logit_bias", "min_ps", "need_min_p_sampling")),
    ("sglang.srt.managers.schedule_batch", "Req", ("eos_token_ids",)),
    # grammars: SGLang's vocabulary mask over our tree, one row per node, built by .grammars while our worker verifies
    ("sglang.srt.constrained.base_grammar_backend", "GrammarMask.apply", ("logits",)),
    (f"{_SPEC}.spec_utils", "build_grammar_vocab_mask", ("reqs", "tree", "sampling_info", "device", "barrier")),
    (f"{_SPEC}.spec_utils", "GrammarTree.resolve", ()),
    ("sglang.srt.constrained.base_grammar_backend", "BaseGrammarObject.allocate_vocab_mask",
     ("vocab_size", "batch_size", "device")),
    ("sglang.srt.layers.attention.base_attn_backend", "AttentionBackend.verify_mask", None),
)


class UnsupportedSGLang(RuntimeError):
    pass


def sglang_version() -> str:
    import sglang
    return sglang.__version__


def check_sglang() -> str:
    """Return the SGLang version after checking it and every internal in :data:`REQUIRED_INTERNALS`."""
    return check_engine("SGLang", sglang_version(), SUPPORTED_VERSIONS, REQUIRED_INTERNALS, UnsupportedSGLang)
