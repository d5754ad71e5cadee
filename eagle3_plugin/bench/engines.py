"""Engines the benchmark can drive. Each generates token ids for token-id prompts, with or without
speculation, and reports acceptance counts in the core's :class:`AcceptanceStats`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..config import Eagle3Config
from ..reference import AcceptanceStats

ENGINES = ("reference",)


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


def open_engine(name: str, target_dir: str, config: Eagle3Config):
    if name == "reference":
        return ReferenceEngine(target_dir, config)
    raise ValueError(f"unknown engine {name!r}; available: {', '.join(ENGINES)}")
