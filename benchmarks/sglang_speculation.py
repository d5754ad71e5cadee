"""SGLang (real server, this CPU with tests/sglang_support), one run, same prompts and machine.

    .venv-sglang/bin/python benchmarks/sglang_speculation.py [--max-prompts N] [--max-new-tokens N] \
        [--concurrency 1,4,16] [--rounds 3]

1. Greedy, with 1, 4, 16 requests in flight (a thread per request slot): tokens/s of no speculation, stock EAGLE-3
   (tree 5/8/32, draft converted to SGLang's layout, eagle3-plugin left out), eagle3-plugin's chain of 5 and its tree
   5/8/32 (real draft probabilities) with the fixed budget, and its tree with the auto budget (per step: the tree, its
   chain or none); mean acceptance length (MAL); our worker's milliseconds per scheduler step by phase, and for the
   auto budget the share of steps that drafted the chain and nothing; outputs checked identical.
2. T = 1: MAL of our tree sampler with the draft's real probabilities vs the same tree verified with the draft
   treated as one-hot (SGLang's ``tree_speculative_sampling_target_only`` rule, run by our sampler with
   ``tree_sampler: one_hot``: stock SGLang on CPU cannot sample speculatively at all, it verifies greedily).

This VM's speed drifts by tens of percent within minutes, so servers measured one after another would each carry
their own spell. The no-speculation server stays up through the run and each other setting's server is up beside it
in turn: for ``--rounds`` rounds the two are measured one after the other at each level (who goes first alternates),
and a setting's ratio is the median of its rounds' ratios to the no-speculation pass beside it. Every server runs
with ``--sleep-on-idle`` (``tests/sglang_support``'s ``CPU_ARGS``): an idle SGLang scheduler otherwise spins a core,
which would slow the one being measured.
Tokens/s are medians of rounds (no speculation's: of every round it ran).

MAL = 1 + accepted drafts / verify rounds (SGLang's ``spec_num_correct_drafts`` / ``spec_verify_ct``).
"""

from __future__ import annotations

import os
import statistics
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
    p.add_argument("--rounds", type=int, default=3, help="passes of each setting beside no speculation, per level")
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

        def launch(index: int, name: str, args: list, plugins):
            """Setting ``name``'s server (not started yet) and the file our worker's timings go to (None where the
            server runs no worker of ours: no speculation, stock EAGLE3)."""
            print(f"[{name}] starting the server ...", file=sys.stderr)
            timings = None
            if args and plugins is None:
                timings = os.environ[FILE_ENV] = os.path.join(tmp, f"timings-{index}.json")  # the server's environment
            else:
                os.environ.pop(FILE_ENV, None)
            log = os.path.join(a.log_dir, f"bench-sglang-{index}.log")
            return SGLangServer(a.target, args, log_path=log, plugins=plugins), timings

        def measure(server, timings_file, level: int) -> dict:
            """One pass of every prompt, ``level`` at a time; ``ms``: our worker's timings over it (or None)."""
            before = None if timings_file is None else PluginTimings.read(timings_file)
            began = time.perf_counter()
            with ThreadPoolExecutor(max_workers=level) as pool:
                outs = list(pool.map(lambda q: server.generate(q, greedy), prompts))
            seconds = time.perf_counter() - began
            tokens = [o["output_ids"] for o in outs]
            ms = None if before is None else PluginTimings.read(timings_file).since(before)
            return {"tps": sum(map(len, tokens)) / seconds, "tokens": tokens, "outs": outs, "ms": ms}

        names = list(settings)
        plain_cells = {level: [] for level in levels}
        rows = [{"setting": names[0], "cells": {}}]
        plain_server, plain_timings = launch(0, names[0], *settings[names[0]][:2])
        with plain_server as plain:
            plain.generate(prompts[0], greedy)  # warm-up
            for index, name in enumerate(names[1:], start=1):
                args, plugins, timed, at_t1 = settings[name]
                server, timings_file = launch(index, name, args, plugins)
                with server:
                    server.generate(prompts[0], greedy)  # warm-up
                    row = {"setting": name, "cells": {}}
                    for level in levels if timed else ():
                        passes, ratios = [], []
                        for round_ in range(a.rounds):  # who goes first alternates
                            if round_ % 2 == 0:
                                base = measure(plain, plain_timings, level)
                                cell = measure(server, timings_file, level)
                            else:
                                cell = measure(server, timings_file, level)
                                base = measure(plain, plain_timings, level)
                            plain_cells[level].append(base)
                            passes.append(cell)
                            ratios.append(cell["tps"] / base["tps"])
                            print(f"[{name}] {level} in flight, round {round_ + 1}: {cell['tps']:.1f} tokens/s, no "
                                  f"speculation {base['tps']:.1f}", file=sys.stderr)
                        row["cells"][level] = _summary(passes, ratios)
                    if at_t1:
                        row["t1_mal"] = mal(server.generate([q for q in prompts for _ in range(a.samples)], sampled,
                                                            timeout=3600))
                    rows.append(row)
        rows[0]["cells"] = {level: _summary(cells) for level, cells in plain_cells.items()}
        reference = plain_cells[levels[0]][0]["tokens"]
        for r in rows:
            for c in r["cells"].values():
                c["identical"] = all(tokens == reference for tokens in c.pop("all_tokens"))
    print(f"\n{len(prompts)} prompts x {a.max_new_tokens} new tokens, greedy, one run ({a.rounds} rounds a setting, "
          f"each beside no speculation: medians); T = 1: {a.samples} generations per prompt\n")
    print("| setting | requests in flight | tokens/s | vs no speculation | MAL | identical | our worker ms/step "
          "(prepare, verify, draft) | steps drafting chain, none |")
    print("|---|---:|---:|---:|---:|---|---|---|")
    for r in rows:
        for level, c in r["cells"].items():
            ms, shares = c["ms"], ""
            if ms:
                shares = ", ".join(f"{v:.0%}" for v in ms.shape_shares())
                ms = ", ".join(f"{v:.2f}" for k, v in ms.per_step_ms().items() if k != "tree_attention")
            mal_cell = "" if c["mal"] is None else f"{c['mal']:.3f}"
            print(f"| {r['setting']} | {level} | {c['tps']:.1f} | {c['ratio']:.2f}x | {mal_cell} | "
                  f"{c['identical']} | {ms or ''} | {shares} |")
    real, one_hot_mal = rows[3]["t1_mal"], rows[5]["t1_mal"]
    print(f"\nT = 1, same draft and tree: real draft probabilities {real:.3f} vs one-hot {one_hot_mal:.3f} "
          f"({real / one_hot_mal:.2f}x)")
    return 0 if all(c["identical"] for r in rows for c in r["cells"].values()) else 1


def _summary(passes: list, ratios: list | None = None) -> dict:
    """One cell from its rounds' ``passes`` and their ``ratios`` to no speculation (None: the no-speculation row
    itself): median tokens/s and ratio, MAL, our worker's timings summed over the rounds (where it ran), every
    pass's outputs (``all_tokens``, for the identity check)."""
    ms = None
    if passes[0]["ms"] is not None:
        ms = type(passes[0]["ms"])(*map(sum, zip(*(vars(p["ms"]).values() for p in passes))))
    return {"tps": statistics.median(p["tps"] for p in passes), "ratio": statistics.median(ratios) if ratios else 1.0,
            "mal": mal(passes[-1]["outs"]) if ratios else None, "ms": ms,
            "all_tokens": [p["tokens"] for p in passes]}


if __name__ == "__main__":
    sys.exit(main())
