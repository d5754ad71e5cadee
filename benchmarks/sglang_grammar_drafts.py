"""SGLang (real server, this CPU with tests/sglang_support), grammar requests under our tree: the working tree
against a base revision, servers one at a time, alternating for ``--rounds`` rounds so both see the same drift.

    .venv-sglang/bin/python benchmarks/sglang_grammar_drafts.py [--base HEAD] [--rounds 4] [--batch 12] \
        [--budget fixed|auto]

The base revision is served from a ``git archive`` of its ``eagle3_plugin`` put first on the server's PYTHONPATH
(the installed package is an editable one, found after it; servers start in a folder without the package, and each
revision's server is checked to import its own code; who goes first alternates, and each server first serves an
untimed pass). Per grammar (none, a regex of words, a small JSON schema) and batch (one request, and ``--batch``
requests at once), greedy: tokens/s (median over rounds; the rows without a grammar, the same code in both, show the
drift left; and each round's ratio), mean acceptance length (1 + accepted drafts / verify rounds), the worker's
draft milliseconds a step (where the masks are made) and whether both revisions gave the same outputs. Made for stop
56's drafts masked by SGLang's own grammars (base: unmasked drafts).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from bundled_args import ROOT, bundled_parser, bundled_prompts
sys.path.insert(0, os.path.join(ROOT, "tests", "sglang_support"))
from launch import CPU_ARGS, fixed_budget_config, server_env  # noqa: E402

from eagle3_plugin.timings import FILE_ENV, PluginTimings  # noqa: E402

SCHEMA = json.dumps({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                     "required": ["name", "age"]})
GRAMMARS = {"none": {}, "regex [a-z]+( [a-z]+)*": {"regex": "[a-z]+( [a-z]+)*"}, "small JSON schema":
            {"json_schema": SCHEMA}}


def export_revision(revision: str, into: str) -> None:
    os.makedirs(into)
    archive = subprocess.run(["git", "-C", ROOT, "archive", revision, "eagle3_plugin"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)


def served_package(env: dict) -> str:
    """Where a server with ``env``, started in this folder, imports ``eagle3_plugin`` from."""
    code = "import os, eagle3_plugin; print(os.path.dirname(os.path.dirname(eagle3_plugin.__file__)))"
    return subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def passes(server, prompts: list, batch: int, max_new_tokens: int, timings: str) -> dict:
    """``{(grammar, requests): (tokens/s, MAL, outputs, the worker's draft ms a step)}`` from one pass over every
    grammar and batch (``timings``: where the server's worker writes its timings)."""
    cells = {}
    for name, grammar in GRAMMARS.items():
        for requests in (1, batch):
            params = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True, **grammar}
            before = PluginTimings.read(timings)
            began = time.perf_counter()
            with ThreadPoolExecutor(max_workers=requests) as pool:
                outs = list(pool.map(lambda q: server.generate(q, params), prompts[:requests]))
            seconds = time.perf_counter() - began
            rounds = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
            mal = 1 + sum(o["meta_info"]["spec_num_correct_drafts"] for o in outs) / rounds
            tokens = [o["output_ids"] for o in outs]
            draft_ms = PluginTimings.read(timings).since(before).per_step_ms()["draft"]
            cells[name, requests] = (sum(map(len, tokens)) / seconds, mal, tokens, draft_ms)
    return cells


def main(argv=None) -> int:
    p = bundled_parser(__doc__)
    p.add_argument("--base", default="HEAD", help="the git revision to compare the working tree with")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--budget", choices=("fixed", "auto"), default="fixed",
                   help="fixed: every step drafts the tree; auto: the draft's eagle3.json as it is")
    p.add_argument("--log-dir", default=tempfile.gettempdir())
    a = p.parse_args(argv)

    from eagle3_plugin.sglang.server import SGLangServer

    prompts = bundled_prompts(a, a.batch)
    log_dir, target, draft = (os.path.abspath(path) for path in (a.log_dir, a.target, a.draft))
    results = {"base": [], "working tree": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base")
        export_revision(a.base, base)
        config = fixed_budget_config(draft, os.path.join(tmp, "fixed.json")) if a.budget == "fixed" else \
            os.path.join(draft, "eagle3.json")
        args = [*CPU_ARGS, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", config]
        os.chdir(tmp)  # ``python -m`` puts the folder it starts in first on the path
        envs = {"base": server_env(), "working tree": server_env()}
        envs["base"]["PYTHONPATH"] = os.pathsep.join((base, envs["base"]["PYTHONPATH"]))
        timings = os.path.join(tmp, "timings.json")
        for env in envs.values():
            env[FILE_ENV] = timings  # the worker rewrites its cumulative timings there after every step
        for code, expected in (("base", base), ("working tree", os.path.abspath(ROOT))):
            if served_package(envs[code]) != expected:
                raise SystemExit(f"the {code} server would not import eagle3_plugin from {expected}")
        for round_ in range(a.rounds):
            for code in sorted(results, reverse=bool(round_ % 2)):  # who goes first alternates
                env = envs[code]
                print(f"[round {round_ + 1}, {code}] starting the server ...", file=sys.stderr)
                log = os.path.join(log_dir, f"bench-sglang-grammar-{code.replace(' ', '-')}-{round_}.log")
                if os.path.exists(timings):
                    os.remove(timings)  # the last server's
                with SGLangServer(target, args, env=env, log_path=log) as server:
                    passes(server, prompts, a.batch, 16, timings)  # untimed: a server's first requests run slow
                    results[code].append(passes(server, prompts, a.batch, a.max_new_tokens, timings))
    print(f"\nSGLang, our tree from {draft} ({a.budget} budget), {a.max_new_tokens} new tokens, greedy, {a.rounds} "
          f"rounds, the base ({a.base}) and the working tree alternating\n")
    print("| grammar | requests | base tokens/s | working tree tokens/s | ratio | ratio by round | base MAL | "
          "working tree MAL | draft ms a step, base, working tree | same outputs |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---|---|")
    same_everywhere = True
    for key in results["base"][0]:
        base, new = ([r[key] for r in results[code]] for code in ("base", "working tree"))
        tps_base, tps_new = statistics.median(c[0] for c in base), statistics.median(c[0] for c in new)
        by_round = ", ".join(f"{n[0] / b[0]:.2f}" for b, n in zip(base, new))
        draft_ms = f"{statistics.median(c[3] for c in base):.2f}, {statistics.median(c[3] for c in new):.2f}"
        same = all(c[2] == base[0][2] for c in base + new)
        same_everywhere &= same
        print(f"| {key[0]} | {key[1]} | {tps_base:.1f} | {tps_new:.1f} | {tps_new / tps_base:.2f}x | {by_round} | "
              f"{base[0][1]:.3f} | {new[0][1]:.3f} | {draft_ms} | {same} |")
    return 0 if same_everywhere else 1


if __name__ == "__main__":
    sys.exit(main())
