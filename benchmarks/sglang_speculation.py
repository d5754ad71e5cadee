"""SGLang (real server, this CPU with tests/sglang_support), one run, same prompts and machine.

    .venv-sglang/bin/python benchmarks/sglang_speculation.py [--max-prompts N] [--max-new-tokens N] \
        [--concurrency 1,4,16]

1. Greedy, with 1, 4, 16 requests in flight (a thread per request slot, each server started once): tokens/s of no
   speculation, stock EAGLE-3 (tree 5/8/32, draft converted to SGLang's layout, eagle3-plugin left out),
   eagle3-plugin's chain of 5 and its tree 5/8/32 (real draft probabilities) with the fixed budget, and its tree
   with the auto budget (per step: the tree, its chain or none); mean acceptance length (MAL); our worker's
   milliseconds per scheduler step by phase, and for the auto budget the share of steps that drafted the chain and
   nothing; outputs checked identical.
2. T = 1: MAL of our tree sampler with the draft's real probabilities vs the same tree verified with the draft
   treated as one-hot (SGLang's ``tree_speculative_sampling_target_only`` rule, run by our sampler with
   ``tree_sampler: one_hot``: stock SGLang on CPU cannot sample speculatively at all, it verifies greedily).

MAL = 1 + accepted drafts / verify rounds (SGLang's ``spec_num_correct_drafts`` / ``spec_verify_ct``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from bundled_args import ROOT, bundled_parser
sys.path.insert(0, os.path.join(ROOT, "tests", "sglang_support"))
from launch import STOCK_PLUGINS, SGLangServer, fixed_budget_config  # noqa: E402


def mal(outs) -> float:
    rounds = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    return 1 + sum(o["meta_info"]["spec_num_correct_drafts"] for o in outs) / rounds


def main(argv=None) -> int:
    p = bundled_parser(__doc__)
    p.add_argument("--max-prompts", type=int, default=32)
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--samples", type=int, default=4, help="T = 1 generations per prompt")
    p.add_argument("--log-dir", default=tempfile.gettempdir())
    a = p.parse_args(argv)

    from transformers import AutoTokenizer

    from eagle3_plugin.config import Eagle3Config
    from eagle3_plugin.convert import convert
    from eagle3_plugin.datafiles import encode_prompt, read_prompts
    from eagle3_plugin.timings import FILE_ENV, PluginTimings

    tok = AutoTokenizer.from_pretrained(a.target)
    prompts = [encode_prompt(tok, r.prompt) for r in read_prompts(a.prompts)[:a.max_prompts]]
    greedy = {"max_new_tokens": a.max_new_tokens, "temperature": 0, "ignore_eos": True}
    sampled = {"max_new_tokens": a.max_new_tokens, "temperature": 1.0, "ignore_eos": True}
    ours = Eagle3Config.load(a.draft)
    with tempfile.TemporaryDirectory() as tmp:
        converted = os.path.join(tmp, "draft-sglang")
        convert(a.draft, "sglang", converted, target=a.target)
        one_hot = fixed_budget_config(a.draft, os.path.join(tmp, "one_hot.json"), tree_sampler="one_hot")
        tree = ["--speculative-num-steps", str(ours.depth), "--speculative-eagle-topk", str(ours.top_k),
                "--speculative-num-draft-tokens", str(ours.total_tokens)]
        spec = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path"]
        chain = ["--speculative-num-steps", str(ours.depth), "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(ours.depth + 1)]
        fixed = fixed_budget_config(a.draft, os.path.join(tmp, "fixed.json"))
        shape = f"{ours.depth}/{ours.top_k}/{ours.total_tokens}"
        settings = {  # name: (server args, SGLANG_PLUGINS, greedy timing?, T = 1 samples?)
            "no speculation": ([], None, True, False),
            f"stock EAGLE3 tree {shape}": ([*spec, converted, *tree], STOCK_PLUGINS, True, False),
            f"eagle3-plugin chain {ours.depth}": ([*spec, fixed, *chain], None, True, False),
            f"eagle3-plugin tree {shape}, real draft probs": ([*spec, fixed], None, True, True),
            f"eagle3-plugin tree {shape}, auto budget": ([*spec, os.path.join(a.draft, "eagle3.json"), *tree], None,
                                                         True, False),
            "eagle3-plugin tree, draft as one-hot": ([*spec, one_hot], None, False, True),
        }
        levels = [int(c) for c in a.concurrency.split(",")]
        timings_file = os.path.join(tmp, "timings.json")
        os.environ[FILE_ENV] = timings_file
        rows, reference = [], None
        for name, (args, plugins, timed, at_t1) in settings.items():
            print(f"[{name}] starting the server ...", file=sys.stderr)
            log = os.path.join(a.log_dir, f"bench-sglang-{len(rows)}.log")
            with SGLangServer(a.target, args, log_path=log, plugins=plugins) as server:
                server.generate(prompts[0], greedy)  # warm-up
                row = {"setting": name, "cells": {}}
                for level in levels if timed else ():
                    before = _timings(timings_file, PluginTimings)
                    start = time.perf_counter()
                    with ThreadPoolExecutor(max_workers=level) as pool:
                        outs = list(pool.map(lambda q: server.generate(q, greedy), prompts))
                    seconds = time.perf_counter() - start
                    after = _timings(timings_file, PluginTimings)
                    tokens = [o["output_ids"] for o in outs]
                    reference = reference or tokens
                    ms = None
                    if plugins is None and args:
                        ms = PluginTimings(*(x - y for x, y in zip(vars(after).values(), vars(before).values())))
                    row["cells"][level] = {"tps": sum(map(len, tokens)) / seconds, "identical": tokens == reference,
                                           "mal": mal(outs) if args else None, "ms": ms}
                if at_t1:
                    row["t1_mal"] = mal(server.generate([q for q in prompts for _ in range(a.samples)], sampled,
                                                        timeout=3600))
            rows.append(row)
    print(f"\n{len(prompts)} prompts x {a.max_new_tokens} new tokens, greedy, one run; T = 1: {a.samples} generations "
          "per prompt\n")
    print("| setting | requests in flight | tokens/s | vs no speculation | MAL | identical | our worker ms/step "
          "(prepare, verify, draft) | steps drafting chain, none |")
    print("|---|---:|---:|---:|---:|---|---|---|")
    for r in rows:
        for level, c in r["cells"].items():
            base = rows[0]["cells"][level]["tps"]
            ms, shares = c["ms"], ""
            if ms:
                shares = f"{ms.chain_steps / max(ms.steps, 1):.0%}, {ms.none_steps / max(ms.steps, 1):.0%}"
                ms = ", ".join(f"{v:.2f}" for k, v in ms.per_step_ms().items() if k != "tree_attention")
            mal_cell = "" if c["mal"] is None else f"{c['mal']:.3f}"
            print(f"| {r['setting']} | {level} | {c['tps']:.1f} | {c['tps'] / base:.2f}x | {mal_cell} | "
                  f"{c['identical']} | {ms or ''} | {shares} |")
    real, one_hot_mal = rows[3]["t1_mal"], rows[5]["t1_mal"]
    print(f"\nT = 1, same draft and tree: real draft probabilities {real:.3f} vs one-hot {one_hot_mal:.3f} "
          f"({real / one_hot_mal:.2f}x)")
    return 0 if all(c["identical"] for r in rows for c in r["cells"].values()) else 1


def _timings(path: str, cls):
    """The worker's cumulative timings (zeros before its first step, and for servers without our worker)."""
    try:
        with open(path) as f:
            return cls(**json.load(f))
    except FileNotFoundError:
        return cls()


if __name__ == "__main__":
    sys.exit(main())
