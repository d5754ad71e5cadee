"""The ``sglang.srt.plugins`` entry point: check the engine, register our hooks, and check they took.

SGLang calls general plugins in the launcher (before server arguments are parsed) and in every scheduler
subprocess, and only logs one that raises. So every failure here ends the process with one message
(``SystemExit`` passes SGLang's ``except Exception``). Serve without the plugin with ``SGLANG_PLUGINS``
naming only the other plugins.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_WORKER = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2"


def _hooks():
    from sglang.srt.plugins.hook_registry import HookType

    from . import first_tokens, grammars, settings, verify, waiting, worker
    return (
        (_WORKER, worker.TreeSpeculationWorker, HookType.REPLACE),
        ("sglang.srt.managers.scheduler.Scheduler.run_batch", waiting.count_waiting, HookType.BEFORE),
        ("sglang.srt.speculative.eagle_utils.eagle_sample", verify.eagle_sample, HookType.AROUND),
        ("sglang.srt.layers.sampler.Sampler._sample_from_probs", first_tokens.sample_from_probs, HookType.AROUND),
        ("sglang.srt.speculative.spec_utils.build_grammar_vocab_mask", grammars.build_grammar_vocab_mask,
         HookType.AROUND),
        ("sglang.srt.model_executor.model_runner_components.attention_backend_setup."
         "configure_aux_hidden_state_capture", _without_sglang_eagle3_capture, HookType.AROUND),
        ("sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding", _resolve_before, HookType.BEFORE),
        ("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request", settings.validate_request,
         HookType.AFTER),
    )


def _resolve_before(server_args):
    from .settings import resolve_server_args
    resolve_server_args(server_args)


def _without_sglang_eagle3_capture(original, *args, eagle_use_aux_hidden_state=False, **kwargs):
    """With EAGLE3 our worker captures the target's layers itself (any model): SGLang's capture stays off."""
    from sglang.srt.runtime_context import get_spec

    from .settings import is_ours
    if is_ours(get_spec().speculative_algorithm):
        eagle_use_aux_hidden_state = False
    return original(*args, eagle_use_aux_hidden_state=eagle_use_aux_hidden_state, **kwargs)


def register() -> None:
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry

        from .compat import check_sglang
        version = check_sglang()
        hooks = _hooks()
        for target, hook, kind in hooks:
            HookRegistry.register(target, hook, kind)
        HookRegistry.apply_hooks()
        failed = [target for target, _, _ in hooks if target not in HookRegistry._patched]
        if failed:
            raise RuntimeError(f"SGLang did not apply eagle3-plugin's hook(s) on {', '.join(failed)} (see its log)")
    except Exception as e:
        logger.error("eagle3-plugin: %s", e)
        raise SystemExit(f"eagle3-plugin: {e}") from e
    logger.info("eagle3-plugin registered on SGLang %s: EAGLE3 runs our tree worker, strict sampler and capture",
                version)
