"""What our worker adds to an engine's steps, by phase (both engines; read by the benchmarks)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, astuple, dataclass

FILE_ENV = "EAGLE3_PLUGIN_TIMINGS"  # a path: the SGLang worker writes its timings there after every step


@dataclass
class PluginTimings:
    """Seconds by phase, summed over ``steps`` engine steps."""

    steps: int = 0
    prepare: float = 0.0  # depth positions, tree masks, verify input
    tree_attention: float = 0.0  # tree rows redone in torch, all layers (vLLM)
    verify: float = 0.0  # sampler + KV compaction
    draft: float = 0.0  # draft catch-up + next trees
    chain_steps: int = 0  # steps whose budget drafted the configured tree's chain (auto budget)
    none_steps: int = 0  # steps whose budget drafted nothing (auto budget); the other steps drafted the tree

    def per_step_ms(self) -> dict:
        n = max(self.steps, 1)
        return {k: 1e3 * v / n for k, v in asdict(self).items() if isinstance(v, float)}

    def shape_shares(self) -> tuple[float, float]:
        """The shares of steps that drafted the chain and that drafted nothing (auto budget)."""
        n = max(self.steps, 1)
        return self.chain_steps / n, self.none_steps / n

    def drafted(self, shape, shapes) -> None:
        """Count a step that drafted ``shape``, one of a budget's ``shapes`` (configured tree, chain, none)."""
        if shape.total_tokens == 1:
            self.none_steps += 1
        elif shape != shapes[0]:
            self.chain_steps += 1

    def since(self, earlier: "PluginTimings") -> "PluginTimings":
        """The steps after ``earlier`` (both cumulative, from one worker)."""
        return PluginTimings(*(now - then for now, then in zip(astuple(self), astuple(earlier))))

    @classmethod
    def read(cls, path: str) -> "PluginTimings":
        """What a worker last wrote to ``path`` (:meth:`write`; zeros before its first step)."""
        try:
            with open(path) as f:
                return cls(**json.load(f))
        except FileNotFoundError:
            return cls()

    def write(self, path: str) -> None:
        """Replace ``path`` with these timings as JSON (atomically: readers never see half a file)."""
        with open(path + ".tmp", "w") as f:
            json.dump(asdict(self), f)
        os.replace(path + ".tmp", path)
