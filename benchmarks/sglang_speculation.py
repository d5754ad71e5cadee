"""SGLang (real server, this CPU with tests/sglang_support), one run, same prompts and machine.

    .venv-sglang/bin/python benchmarks/sglang_speculation.py [--max-prompts N] [--max-new-tokens N]

1. Greedy, requests one at a time: tokens/s of no speculation, stock EAGLE-3 (tree 5/8/32, draft converted to
   SGLang's layout, eagle3-plugin left out) and eagle3-plugin (the bundled eagle3.json: tree 5/8/32, real
   draft probabilities); mean acceptance length (MAL); outputs checked identical.
2. T = 1: MAL of our tree sampler with the draft's real probabilities vs the same tree verified with the draft
   treated as one-hot (SGLang's ``tree_speculative_sampling_target_only`` rule, run by our sampler with
   ``tree_sampler: one_hot``: stock SGLang on CPU cannot sample speculatively at all, it verifies greedily).

MAL = 1 + accepted drafts / verify rounds (SGLang's ``spec_num_correct_drafts`` / ``spec_verify_ct``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "sglang_support"))
from launch import STOCK_PLUGINS, SGLangServer  # noqa: E402


def mal(outs) -> float:
    rounds = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    return 1 + sum(o["meta_info"]["spec_num_correct_drafts"] for o in outs) / rounds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=os.path.join(ROOT, "checkpoints/target"))
    p.add_argument("--draft", default=os.path.join(ROOT, "checkpoints/draft"))
    p.add_argument("--prompts", default=os.path.join(ROOT, "checkpoints/prompts/heldout.jsonl"))
    p.add_argument("--max-prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--samples", type=int, default=4, help="T = 1 generations per prompt")
    p.add_argument("--log-dir", default=tempfile.gettempdir())
    a = p.parse_args(argv)

    from transformers import AutoTokenizer

    from eagle3_plugin.config import Eagle3Config
    from eagle3_plugin.convert import convert
    from eagle3_plugin.datafiles import encode_prompt, read_prompts

    tok = AutoTokenizer.from_pretrained(a.target)
    prompts = [encode_prompt(tok, r.prompt) for r in read_prompts(a.prompts)[:a.max_prompts]]
    greedy = {"max_new_tokens": a.max_new_tokens, "temperature": 0, "ignore_eos": True}
    sampled = {"max_new_tokens": a.max_new_tokens, "temperature": 1.0, "ignore_eos": True}
    ours = Eagle3Config.load(a.draft)
    with tempfile.TemporaryDirectory() as tmp:
        converted = os.path.join(tmp, "draft-sglang")
        convert(a.draft, "sglang", converted, target=a.target)
        one_hot = os.path.join(tmp, "one_hot.json")
        with open(one_hot, "w") as f:
            json.dump(ours.to_dict() | {"draft": ours.draft, "tree_sampler": "one_hot"}, f)
        tree = ["--speculative-num-steps", str(ours.depth), "--speculative-eagle-topk", str(ours.top_k),
                "--speculative-num-draft-tokens", str(ours.total_tokens)]
        spec = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path"]
        settings = {  # name: (server args, SGLANG_PLUGINS, greedy timing?, T = 1 samples?)
            "no speculation": ([], None, True, False),
            f"stock EAGLE3 tree {ours.depth}/{ours.top_k}/{ours.total_tokens}": ([*spec, converted, *tree],
                                                                                STOCK_PLUGINS, True, False),
            "eagle3-plugin tree, real draft probs": ([*spec, os.path.join(a.draft, "eagle3.json")], None, True, True),
            "eagle3-plugin tree, draft as one-hot": ([*spec, one_hot], None, False, True),
        }
        rows, reference = [], None
        for name, (args, plugins, timed, at_t1) in settings.items():
            print(f"[{name}] starting the server ...", file=sys.stderr)
            log = os.path.join(a.log_dir, f"bench-sglang-{len(rows)}.log")
            with SGLangServer(a.target, args, log_path=log, plugins=plugins) as server:
                server.generate(prompts[0], greedy)  # warm-up
                row = {"setting": name}
                if timed:
                    start = time.perf_counter()
                    outs = [server.generate(q, greedy) for q in prompts]
                    row["tokens_per_s"] = sum(len(o["output_ids"]) for o in outs) / (time.perf_counter() - start)
                    tokens = [o["output_ids"] for o in outs]
                    reference = reference or tokens
                    row["identical"] = tokens == reference
                    row["greedy_mal"] = mal(outs) if args else None
                if at_t1:
                    row["t1_mal"] = mal(server.generate([q for q in prompts for _ in range(a.samples)], sampled,
                                                        timeout=3600))
            rows.append(row)
    base = rows[0]["tokens_per_s"]
    print(f"\n{len(prompts)} prompts x {a.max_new_tokens} new tokens; greedy requests one at a time; "
          f"T = 1: {a.samples} generations per prompt\n")
    print("| setting | greedy tokens/s | vs no speculation | greedy MAL | identical | T = 1 MAL |")
    print("|---|---:|---:|---:|---|---:|")
    for r in rows:
        tps = r.get("tokens_per_s")
        cells = [f"{tps:.1f}" if tps else "", f"{tps / base:.2f}x" if tps else "",
                 f"{r['greedy_mal']:.3f}" if r.get("greedy_mal") else "", str(r.get("identical", "")),
                 f"{r['t1_mal']:.3f}" if r.get("t1_mal") else ""]
        print(f"| {r['setting']} | " + " | ".join(cells) + " |")
    real, one_hot_mal = rows[2]["t1_mal"], rows[3]["t1_mal"]
    print(f"\nT = 1, same draft and tree: real draft probabilities {real:.3f} vs one-hot {one_hot_mal:.3f} "
          f"({real / one_hot_mal:.2f}x)")
    return 0 if all(r.get("identical", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
