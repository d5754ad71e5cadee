"""Acceptance of the dynamic tree vs a chain, and of the two T>0 tree samplers, on the bundled checkpoint.

One run, same prompts, side by side (reference generator, greedy unless stated):
  1. chain of depth D  vs  dynamic tree of depth D (mean acceptance length, ratio; issue target >= 1.2x)
  2. at T=1: real-probability tree sampler vs q-one-hot tree sampler on the same tree settings

    .venv/bin/python benchmarks/tree_vs_chain.py [--prompts FILE] [--max-prompts N] [--max-new-tokens N]
"""

from __future__ import annotations

import sys

from transformers import AutoTokenizer

from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.reference import AcceptanceStats, SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams

from bundled_args import bundled_parser


def acceptance(gen: SpeculativeGenerator, prompts, max_new_tokens: int, temperature: float, seed: int = 0):
    stats = AcceptanceStats(gen.config.depth)
    for i, prompt in enumerate(prompts):
        out = gen.generate([prompt], max_new_tokens, SamplingParams.uniform(1, temperature=temperature), seed=seed + i)
        stats.merge(out.stats)
    return stats


def main(argv=None) -> int:
    p = bundled_parser(__doc__)
    p.add_argument("--max-prompts", type=int, default=24)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--tree", help="DEPTH,TOPK,TOTAL (default: the draft's eagle3.json)")
    a = p.parse_args(argv)
    base = Eagle3Config.load(a.draft)
    depth, top_k, total = (int(x) for x in a.tree.split(",")) if a.tree else (base.depth, base.top_k,
                                                                              base.total_tokens)
    tok = AutoTokenizer.from_pretrained(a.target)
    prompts = [encode_prompt(tok, r.prompt) for r in read_prompts(a.prompts)[: a.max_prompts]]
    tree = Eagle3Config(draft=base.draft, layer_ids=base.layer_ids, depth=depth, top_k=top_k, total_tokens=total)
    chain = Eagle3Config.chain(depth, draft=base.draft, layer_ids=base.layer_ids)
    one_hot = Eagle3Config(**{**tree.to_dict(), "layer_ids": base.layer_ids, "tree_sampler": "one_hot"})
    gen = SpeculativeGenerator.from_pretrained(a.target, chain)

    rows = []
    for name, config, temperature in [("chain (greedy)", chain, 0.0), ("tree (greedy)", tree, 0.0),
                                      ("tree, real-probability sampler (T=1)", tree, 1.0),
                                      ("tree, q-one-hot sampler (T=1)", one_hot, 1.0)]:
        gen.config = config
        stats = acceptance(gen, prompts, a.max_new_tokens, temperature)
        rows.append((name, stats))
        print(f"  {name}: {stats.mean_acceptance_length:.3f}", file=sys.stderr)
    print(f"## Acceptance on {len(prompts)} held-out prompts, {a.max_new_tokens} new tokens, "
          f"depth {depth}, tree top_k {top_k}, {total} tokens/round\n")
    print("| setting | mean acceptance length | rounds | per-position acceptance |")
    print("|---|---:|---:|---|")
    for name, s in rows:
        per = ", ".join(f"{r:.2f}" for r in s.acceptance_rate_per_position)
        print(f"| {name} | {s.mean_acceptance_length:.3f} | {s.rounds} | {per} |")
    chain_s, tree_s, real_s, onehot_s = (s for _, s in rows)
    print(f"\ntree / chain (greedy): {tree_s.mean_acceptance_length / chain_s.mean_acceptance_length:.3f}x")
    print(f"real / q-one-hot (T=1): {real_s.mean_acceptance_length / onehot_s.mean_acceptance_length:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
