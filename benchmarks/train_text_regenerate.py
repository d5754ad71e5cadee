"""Plain-text training data with and without ``--regenerate``, same target, same minutes, one run.

    .venv/bin/python benchmarks/train_text_regenerate.py [--minutes 3] [--documents 400]

Writes the bundled training prompts as a ``.txt`` file (one document per record, blank-line separated), trains one
draft on the raw text and one with ``--regenerate`` (each document's opening as the prompt, the target writes the
rest), each with the same time budget, and prints each draft's chain-of-5 mean acceptance length on held-out
prompts (reference generator, greedy).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=os.path.join(ROOT, "checkpoints/target"))
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--documents", type=int, default=400)
    p.add_argument("--eval-prompts", type=int, default=16)
    a = p.parse_args(argv)

    from eagle3_plugin.cli import main as eagle3
    from eagle3_plugin.config import Eagle3Config
    from eagle3_plugin.datafiles import encode_prompt, read_prompts
    from eagle3_plugin.reference import AcceptanceStats, SpeculativeGenerator
    from eagle3_plugin.sampler import SamplingParams
    from transformers import AutoTokenizer

    records = read_prompts(os.path.join(ROOT, "checkpoints/prompts/train_prompts.jsonl"))[:a.documents]
    tok = AutoTokenizer.from_pretrained(a.target)
    held_out = [encode_prompt(tok, r.prompt) for r in
                read_prompts(os.path.join(ROOT, "checkpoints/prompts/heldout.jsonl"))[:a.eval_prompts]]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "documents.txt")
        with open(text, "w") as f:
            f.write("\n\n\n".join(r.prompt for r in records))
        for name, extra in (("raw text", []), ("--regenerate", ["--regenerate"])):
            out = os.path.join(tmp, name.strip("-"))
            assert eagle3(["train", "--target", a.target, "--data", text, "--out", out, "--layers", "1,3,5",
                           "--draft-vocab", "1024", "--max-minutes", str(a.minutes), *extra]) == 0
            gen = SpeculativeGenerator.from_pretrained(a.target, Eagle3Config.chain(5, draft=out))
            stats = AcceptanceStats(5)
            for prompt in held_out:
                stats.merge(gen.generate([prompt], 64, SamplingParams.uniform(1)).stats)
            rows.append((name, stats.mean_acceptance_length))
    print(f"\n{len(records)} documents as .txt, {a.minutes} minutes of training each; chain of 5, {len(held_out)} "
          "held-out prompts x 64 tokens, greedy\n")
    print("| training data | mean acceptance length |\n|---|---:|")
    for name, mal in rows:
        print(f"| {name} | {mal:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
