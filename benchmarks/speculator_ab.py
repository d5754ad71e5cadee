"""The core speculator's step time, a git revision against the working tree, in one process, steps interleaved.

This 2-core VM's speed drifts by tens of percent between runs and within minutes, so two runs of a benchmark, one
per version, cannot show a change of a few percent. Here both versions of ``eagle3_plugin`` are imported side by
side (the revision's copy renamed), each drafts the same synthetic rows (the bundled draft, ``--context`` stored
positions a row, one new entry: a decode step), and their steps alternate, so both see the same drift; each cell
keeps the mean of the fastest third of its steps. Each cell also checks that both versions grow the same trees
(tokens, parents, depths; the draft probabilities at T>0, same seeds).

    .venv/bin/python benchmarks/speculator_ab.py [--base HEAD~1] [--batches 1,16] [--temperature 0]

On a GPU (``--device cuda``) each step is timed with CUDA events; where there is no git (the lent GPU machine),
``--base-dir`` names a folder holding the revision's package already exported as ``eagle3_base``.
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


def drafting(package: str, batch: int, shape: str, context: int, temperature: float, device: str = "cpu"):
    """A function that runs one ``Speculator.step`` of ``package`` (seed: its generator's) and returns the tree."""
    module = lambda name: importlib.import_module(f"{package}.{name}")  # noqa: E731
    spec, config = module("speculator"), module("config")
    torch.manual_seed(0)
    draft = module("checkpoint").load_draft(os.path.join(ROOT, "checkpoints/draft")).to(device)
    draft.attach_embedding(nn.Embedding(draft.config.vocab_size, draft.config.hidden_size).to(device))
    cfg = config.Eagle3Config.load(os.path.join(ROOT, "checkpoints/draft"))
    speculator = spec.Speculator(draft, cfg)
    tree_shape = spec.TreeShape.of(cfg) if shape == "tree" else spec.TreeShape(cfg.depth, 1, cfg.depth + 1)
    c = draft.config
    kv = spec.DraftKV.allocate(batch * (context + 1), c.num_key_value_heads, c.head_dim, torch.float32, device)
    slots = torch.arange(batch * (context + 1), device=device).view(batch, context + 1)
    rows = spec.DraftRows(slots, torch.full((batch,), context, device=device),
                          torch.ones(batch, dtype=torch.long, device=device),
                          torch.randint(c.vocab_size, (batch, 1)).to(device),
                          torch.randn(batch, 1, draft.fc.in_features).to(device))
    params = module("sampler").SamplingParams.uniform(batch, temperature=temperature, device=device)
    return lambda seed=0: speculator.step(kv, rows, params, torch.Generator(device).manual_seed(seed), tree_shape)


def timed(step, device: str) -> float:
    """Seconds of one ``step()``: on a GPU between CUDA events (the queue drained first)."""
    if device == "cpu":
        began = time.perf_counter()
        step()
        return time.perf_counter() - began
    torch.cuda.synchronize()
    began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began.record()
    step()
    ended.record()
    ended.synchronize()
    return began.elapsed_time(ended) / 1e3


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
    p.add_argument("--device", default="cpu")
    p.add_argument("--base-dir", help="a folder holding the base revision's package, exported as eagle3_base")
    a = p.parse_args(argv)
    if a.device == "cpu":
        torch.set_num_threads(1)  # as an engine's worker runs on this machine
    with tempfile.TemporaryDirectory() as tmp:
        if a.base_dir:
            tmp = os.path.abspath(a.base_dir)
        else:
            export_revision(a.base, tmp)
        sys.path[:0] = [tmp, ROOT]
        print(f"## Speculator.step, {a.base} against the working tree, one process, steps interleaved "
              f"(T={a.temperature}, {a.context} stored positions a row)\n")
        print(f"| batch | shape | {a.base} ms | working tree ms | ratio | same trees |")
        print("|---:|---|---:|---:|---:|---|")
        for batch in (int(b) for b in a.batches.split(",")):
            for shape in a.shapes.split(","):
                steps = {name: drafting(name, batch, shape, a.context, a.temperature, a.device)
                         for name in (BASE_PACKAGE, "eagle3_plugin")}
                same = same_trees(*(step(seed=1) for step in steps.values()))
                seconds = {name: [] for name in steps}
                for _ in range(5):  # warm-up
                    for step in steps.values():
                        step()
                for _ in range(a.steps):
                    for name, step in steps.items():
                        seconds[name].append(timed(step, a.device))
                fastest = {name: 1e3 * sum(sorted(s)[:a.steps // 3]) / (a.steps // 3) for name, s in seconds.items()}
                base, new = fastest[BASE_PACKAGE], fastest["eagle3_plugin"]
                print(f"| {batch} | {shape} | {base:.2f} | {new:.2f} | {new / base:.3f} | "
                      f"{'yes' if same else 'NO'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
