"""Drafts that obey a request's grammar (``structured_outputs``), from the worker's own copy of its matcher.

vLLM's scheduler, in the engine core's process, holds each grammar request's matcher: it masks the target's logits
along the drafted chain, but nothing masks the draft, which proposes free text where the grammar forbids most of it.
The worker runs in a process of its own, so :class:`WorkerGrammars` keeps a matcher per grammar request there:
compiled as vLLM compiles it (its xgrammar backend, from the request's ``structured_outputs``, in a thread: until it
is ready the request's drafts stay unmasked) and advanced by the request's output tokens. While a step drafts, the
core's :class:`~eagle3_plugin.grammar_drafts.DraftGrammars` reads them, along each row's leading path only (vLLM
verifies a grammar row's drafts as a chain), and leaves them as it found them.

The masks change only what the draft proposes (a mask that differed from vLLM's, another backend's grammar or a
tokenizer quirk, would cost acceptance, never correctness). Drafts stay unmasked with tensor parallelism (each
rank's compilation would be ready at its own step, and ranks must grow the same trees), with a reasoning parser (a
grammar then starts where the scheduler says), and for a grammar xgrammar cannot compile.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

from ..grammar_drafts import DraftGrammars, advance


@dataclass
class _Tracked:
    """A request's compilation, then its matcher and how many of its output tokens the matcher has taken."""

    compiled: Future
    matcher: object = None
    taken: int = 0
    usable: bool = True


class WorkerGrammars:
    """The worker's matcher of every grammar request (see the module's docstring)."""

    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        config = vllm_config.structured_outputs_config
        self.enabled = vllm_config.parallel_config.tensor_parallel_size == 1 and \
            not (config.reasoning_parser and not config.enable_in_reasoning) and \
            not vllm_config.model_config.skip_tokenizer_init
        self.vocab_size = vllm_config.model_config.get_vocab_size()
        self._backend = None
        self._compiler: Optional[ThreadPoolExecutor] = None
        self._tracked: dict[str, _Tracked] = {}

    def drafting(self, requests: dict, req_ids: list[str], rows: list[int],
                 emitted: list[list[int]]) -> DraftGrammars:
        """The grammars of ``rows`` (requests with ``structured_outputs``) for one step's drafting, ``emitted``
        being each row's tokens of this step; requests no longer in ``requests`` (vLLM's) are forgotten."""
        for req_id in [r for r in self._tracked if r not in requests]:
            del self._tracked[req_id]
        matchers = {}
        for row in rows if self.enabled else ():
            matcher = self._matcher(req_ids[row], requests[req_ids[row]])
            if matcher is not None:
                matchers[row] = matcher
        return DraftGrammars(matchers, emitted, self.vocab_size, whole_tree=False)  # vLLM masks a chain

    def _matcher(self, req_id: str, request):
        """The request's matcher after its output so far, or None (compiling, not compilable, or out of step)."""
        tracked = self._tracked.get(req_id)
        if tracked is None:
            self._tracked[req_id] = _Tracked(self._compile(request.sampling_params))  # ready at a later step
            return None
        if not tracked.usable or not tracked.compiled.done():
            return None
        if tracked.matcher is None:
            if tracked.compiled.exception() is not None:
                tracked.usable = False
                return None
            tracked.matcher = tracked.compiled.result().matcher
        output = request.output_token_ids
        new = output[tracked.taken:]
        if len(output) < tracked.taken or advance(tracked.matcher, new) < len(new):
            tracked.usable = False  # its output is not what the matcher took (or the grammar has ended)
            return None
        tracked.taken = len(output)
        return tracked.matcher

    def _compile(self, params) -> Future:
        """The request's grammar compiled in a thread; any failure is the future's, and leaves the request's drafts
        unmasked (a grammar xgrammar cannot compile), or every request's (no backend: no tokenizer, say)."""
        try:
            if self._compiler is None:
                from vllm.tokenizers import cached_tokenizer_from_config
                from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

                tokenizer = cached_tokenizer_from_config(model_config=self.vllm_config.model_config)
                self._backend = XgrammarBackend(self.vllm_config, tokenizer=tokenizer, vocab_size=self.vocab_size)
                self._compiler = ThreadPoolExecutor(1, thread_name_prefix="eagle3-grammar")
            from vllm.v1.structured_output.request import get_structured_output_key

            request_type, spec = get_structured_output_key(params.structured_outputs)
            return self._compiler.submit(self._backend.compile_grammar, request_type, spec, params.all_stop_token_ids)
        except Exception as error:  # noqa: BLE001 (what vLLM's own compilation may raise is open-ended)
            self.enabled = self._compiler is not None  # no backend: no masks for any request
            failed = Future()
            failed.set_exception(error)
            return failed
