"""The core speculator's step time, a git revision against the working tree, in one process, steps interleaved.

This 2-core VM's speed drifts by tens of percent between runs and within minutes, so two runs of a benchmark, one
per version, cannot show a change of a few percent. Here both versions of ``eagle3_plugin`` are imported side by
side (the revision's copy renamed), each drafts the same synthetic rows (the bundled draft, ``--context`` stored
positions a row, one new entry: a decode step), and their steps alternate, so both see the same drift; each cell
keeps the mean of the fastest third of its steps. Each cell also checks that both versions grow the same trees
(tokens, parents, depths; the draft probabilities at T>0, same seeds).

    .venv/bin/python benchmarks/speculator_ab.py [--base HEAD~1] [--batches 1,16] [--temperature 0]
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BASE_PACKAGE = "eagle3_base"


def export_revision(revision: str, into: str) -> None:
    """``eagle3_plugin`` at ``revision`` as the package :data:`BASE_PACKAGE` under ``into`` (its imports are
    relative, so the renamed copy imports itself)."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", revision, "eagle3_plugin"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    os.rename(os.path.join(into, "eagle3_plugin"), os.path.join(into, BASE_PACKAGE))


def drafting(package: str, batch: int, shape: str, context: int, temperature: float):
    """A function that runs one ``Speculator.step`` of ``package`` (seed: its generator's) and returns the tree."""
    module = lambda name: importlib.import_module(f"{package}.{name}")  # noqa: E731
    spec, config = module("speculator"), module("config")
    torch.manual_seed(0)
    draft = module("checkpoint").load_draft(os.path.join(ROOT, "checkpoints/draft"))
    draft.attach_embedding(nn.Embedding(draft.config.vocab_size, draft.config.hidden_size))
    cfg = config.Eagle3Config.load(os.path.join(ROOT, "checkpoints/draft"))
    speculator = spec.Speculator(draft, cfg)
    tree_shape = spec.TreeShape.of(cfg) if shape == "tree" else spec.TreeShape(cfg.depth, 1, cfg.depth + 1)
    c = draft.config
    kv = spec.DraftKV.allocate(batch * (context + 1), c.num_key_value_heads, c.head_dim, torch.float32)
    slots = torch.arange(batch * (context + 1)).view(batch, context + 1)
    rows = spec.DraftRows(slots, torch.full((batch,), context), torch.ones(batch, dtype=torch.long),
                          torch.randint(c.vocab_size, (batch, 1)), torch.randn(batch, 1, draft.fc.in_features))
    params = module("sampler").SamplingParams.uniform(batch, temperature=temperature)
    return lambda seed=0: speculator.step(kv, rows, params, torch.Generator().manual_seed(seed), tree_shape)


def same_trees(a, b) -> bool:
    for name in ("tokens", "parents", "depths", "draft_probs"):
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None) or (x is not None and not torch.equal(x, y)):
            return False
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="HEAD", help="the git revision to compare the working tree with")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--shapes", default="tree,chain", help="the bundled eagle3.json's tree, and its chain")
    p.add_argument("--context", type=int, default=250)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=90, help="timed steps per version and cell")
    a = p.parse_args(argv)
    torch.set_num_threads(1)  # as an engine's worker runs on this machine
    with tempfile.TemporaryDirectory() as tmp:
        export_revision(a.base, tmp)
        sys.path[:0] = [tmp, ROOT]
        print(f"## Speculator.step, {a.base} against the working tree, one process, steps interleaved "
              f"(T={a.temperature}, {a.context} stored positions a row)\n")
        print(f"| batch | shape | {a.base} ms | working tree ms | ratio | same trees |")
        print("|---:|---|---:|---:|---:|---|")
        for batch in (int(b) for b in a.batches.split(",")):
            for shape in a.shapes.split(","):
                steps = {name: drafting(name, batch, shape, a.context, a.temperature)
                         for name in (BASE_PACKAGE, "eagle3_plugin")}
                same = same_trees(*(step(seed=1) for step in steps.values()))
                seconds = {name: [] for name in steps}
                for _ in range(5):  # warm-up
                    for step in steps.values():
                        step()
                for _ in range(a.steps):
                    for name, step in steps.items():
                        began = time.perf_counter()
                        step()
                        seconds[name].append(time.perf_counter() - began)
                fastest = {name: 1e3 * sum(sorted(s)[:a.steps // 3]) / (a.steps // 3) for name, s in seconds.items()}
                base, new = fastest[BASE_PACKAGE], fastest["eagle3_plugin"]
                print(f"| {batch} | {shape} | {base:.2f} | {new:.2f} | {new / base:.3f} | "
                      f"{'yes' if same else 'NO'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
