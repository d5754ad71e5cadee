"""Which vLLM versions we support, and a check of every vLLM internal the plugin touches.

An unsupported version, or a supported one whose internals differ from what we patch, gets one
:class:`UnsupportedVllm` error listing everything that is missing, never a silent fallback.
"""

from __future__ import annotations

from ..internals import check_engine
from .admission import UNSUPPORTED

SUPPORTED_VERSIONS = ("0.32.0",)

# (module, attribute path, parameter names the plugin relies on, or None for "exists")
REQUIRED_INTERNALS = (
    ("vllm.triton_utils.dispatcher", "register_kernels", ("overrides",)),
    ("vllm.platforms.cpu", "CpuPlatform.register_triton_kernel_overrides", ()),
    ("vllm.v1.sample.rejection_sampler", "expand_kernel", None),
    ("vllm.v1.sample.rejection_sampler", "expand_batch_to_tokens",
     ("x", "cu_num_tokens", "num_tokens", "replace_from", "replace_to")),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._setup_eagle3_aux_hidden_state_outputs", ()),
    ("vllm.model_executor.models.interfaces", "supports_eagle3", ("model",)),
    ("vllm.model_executor.models.interfaces", "SupportsEagle3.set_aux_hidden_state_layers", ("layers",)),
    # --speculative-config PATH.json on vLLM's command line; the vllm script's version lookup (start-up hook)
    ("vllm.engine.arg_utils", "EngineArgs.add_cli_args", ("parser",)),
    ("vllm.engine.arg_utils", "AsyncEngineArgs.add_cli_args", ("parser",)),
    ("vllm.entrypoints.cli.main", "main", ()),
    # our config -> vLLM's, in additional_config
    ("vllm.engine.arg_utils", "EngineArgs.create_engine_config", ()),
    ("vllm.engine.arg_utils", "EngineArgs", ("speculative_config", "additional_config", "tensor_parallel_size",
                                             "pipeline_parallel_size", "data_parallel_size", "kv_cache_dtype")),
    ("vllm.config.vllm", "VllmConfig", ("additional_config",)),
    # tree attention on the CPU backend
    ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl.forward",
     ("layer", "query", "key", "value", "kv_cache", "attn_metadata", "output")),
    ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionMetadata", ("query_start_loc", "seq_lens", "block_table")),
    # the cache layout (ISA) a KV group's builder picks, and hands its layers, at start-up
    ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionMetadataBuilder.__init__",
     ("kv_cache_spec", "layer_names", "vllm_config", "device")),
    ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionMetadataBuilder._set_isa_to_layers", ("layer_names",)),
    # the tree worker's runner hooks
    ("vllm.v1.worker.cpu_worker", "CPUModelRunner", None),
    ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner.load_model", ()),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._update_states", ("scheduler_output",)),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._prepare_inputs",
     ("scheduler_output", "num_scheduled_tokens")),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample", ("logits", "spec_decode_metadata")),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._input_fits_in_drafter", ("common_attn_metadata",)),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.propose_draft_token_ids",
     ("scheduler_output", "sampled_token_ids", "sampling_metadata", "hidden_states", "sample_hidden_states",
      "aux_hidden_states")),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._bookkeeping_sync", ()),
    # each KV group's slot of every token of the step (its ``slot_mapping``): KV compaction, a decode step's entries
    ("vllm.v1.worker.block_table", "BlockTable.compute_slot_mapping", ("num_reqs", "query_start_loc", "positions")),
    # the step's draft tokens travel with its output (draft_handoff)
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sample_tokens", ("grammar_output",)),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.take_draft_token_ids", ()),
    ("vllm.v1.outputs", "ModelRunnerOutput", None),
    ("vllm.v1.outputs", "EMPTY_MODEL_RUNNER_OUTPUT", None),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output", ("scheduler_output", "model_runner_output")),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_draft_token_ids", ("draft_token_ids",)),
    ("vllm.v1.engine.core", "EngineCore.post_step", ("model_executed",)),
    # how many requests wait, with each step (waiting)
    ("vllm.v1.core.sched.scheduler", "Scheduler.schedule", ()),
    ("vllm.v1.core.sched.scheduler", "Scheduler.get_request_counts", ()),
    ("vllm.v1.core.sched.output", "SchedulerOutput", ("scheduled_new_reqs", "scheduled_cached_reqs",
                                                      "scheduled_spec_decode_tokens", "finished_req_ids",
                                                      "preempted_req_ids", "has_structured_output_requests")),
    ("vllm.v1.core.sched.output", "CachedRequestData", ("resumed_req_ids",)),
    ("vllm.v1.outputs", "SamplerOutput", ("sampled_token_ids", "logprobs_tensors")),
    ("vllm.v1.sample.sampler", "Sampler.compute_logprobs", ("logits",)),
    ("vllm.v1.sample.sampler", "Sampler.gather_logprobs", ("logprobs", "num_logprobs", "token_ids")),
    ("vllm.v1.sample.sampler", "Sampler.gather_specific_token_logprobs", ("logprobs", "logprob_token_ids", "sampled")),
    # output rules (penalties, allowed ids, bad words; min_tokens from its processor's rows, filled by add_request)
    ("vllm.v1.sample.metadata", "SamplingMetadata",
     ("no_penalties", "prompt_token_ids", "frequency_penalties", "presence_penalties", "repetition_penalties",
      "output_token_ids", "allowed_token_ids_mask", "bad_words_token_ids", "logitsprocs", "max_num_logprobs",
      "logprob_token_ids")),
    ("vllm.v1.sample.logits_processor.builtin", "MinTokensLogitsProcessor.add_request", ("params", "output_tok_ids")),
    # logit_bias and min_p: vLLM's built-in processors, which a speculative vLLM leaves out, built for our runner
    ("vllm.v1.sample.logits_processor", "BUILTIN_LOGITS_PROCESSORS", None),
    ("vllm.v1.sample.logits_processor", "LogitsProcessors", ("logitsprocs",)),
    ("vllm.v1.sample.logits_processor.builtin", "LogitBiasLogitsProcessor.update_state", ("batch_update",)),
    ("vllm.v1.sample.logits_processor.builtin", "MinPLogitsProcessor.update_state", ("batch_update",)),
    ("vllm.v1.worker.gpu_input_batch", "InputBatch._make_sampling_metadata", ()),
    # grammars: which rows have one (drafted as chains), vLLM's scheduler cutting their drafts as a chain
    ("vllm.v1.worker.gpu_input_batch", "CachedRequestState", ("sampling_params", "output_token_ids")),
    ("vllm.v1.structured_output", "StructuredOutputManager.validate_tokens", ("request", "spec_tokens")),
    # the worker's own grammar matchers, for drafting (grammars.py)
    ("vllm.v1.structured_output.backend_xgrammar", "XgrammarBackend", ("vllm_config", "tokenizer", "vocab_size")),
    ("vllm.v1.structured_output.backend_xgrammar", "XgrammarBackend.compile_grammar",
     ("request_type", "grammar_spec", "stop_token_ids")),
    ("vllm.v1.structured_output.backend_xgrammar", "XgrammarGrammar", ("matcher",)),
    ("vllm.v1.structured_output.request", "get_structured_output_key", ("params",)),
    ("vllm.tokenizers", "cached_tokenizer_from_config", ("model_config",)),
    ("vllm.config.structured_outputs", "StructuredOutputsConfig", ("reasoning_parser", "enable_in_reasoning")),
    ("vllm.sampling_params", "SamplingParams.all_stop_token_ids", None),
    ("vllm.utils.torch_utils", "PIN_MEMORY", None),
    # admission: settings the worker does not apply are refused in the front end
    ("vllm.v1.engine.input_processor", "InputProcessor._validate_params", ("params",)),
    ("vllm.sampling_params", "SamplingParams._validate_spec_decode", ("speculative_config",)),
    ("vllm.exceptions", "VLLMValidationError", ("message", "parameter")),
    ("vllm.sampling_params", "SamplingParams",
     tuple(attr for attr, _, _ in UNSUPPORTED) + ("structured_outputs", "logprobs", "min_p", "logit_bias")),
    ("vllm.model_executor.layers.attention", "Attention", None),
    # tensor parallelism: rank 0's tree shape to the others; the draft layer's cache spec read from its kv heads
    ("vllm.distributed.parallel_state", "get_tp_group", ()),
    ("vllm.distributed.parallel_state", "GroupCoordinator.broadcast", ("input_", "src")),
    ("vllm.model_executor.layers.attention.attention", "Attention.get_kv_cache_spec", ("vllm_config",)),
    # an error in a follower rank's step ends its process, which the executor watches (tensor_parallel.step_guard)
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model", ("scheduler_output",)),
    ("vllm.v1.executor.multiproc_executor", "MultiprocExecutor.start_worker_monitor", ()),
)


class UnsupportedVllm(RuntimeError):
    pass


def vllm_version() -> str:
    import vllm
    return vllm.__version__.split("+")[0]


def check_vllm() -> str:
    """Return the vLLM version after checking it and every internal in :data:`REQUIRED_INTERNALS`."""
    return check_engine("vLLM", vllm_version(), SUPPORTED_VERSIONS, REQUIRED_INTERNALS, UnsupportedVllm)
