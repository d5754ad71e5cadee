"""The main job: serve a target with vLLM + EAGLE-3 on 127.0.0.1, send requests, report, stop.

    python -m eagle3_plugin.vllm.demo --target DIR --speculative-config CONFIG --prompts FILE

Starts a server without speculation, one with vLLM's native EAGLE-3 chain (same draft, depth as ours) and one with
our config, all three at once, then sends the same prompts one at a time to each server in turn, for several rounds,
and prints each server's median tokens/s over the rounds, their ratios, and the mean acceptance length from each
server's own ``/metrics``. In turn, because this kind of machine's speed drifts by tens of percent within minutes:
servers measured one after another would see different machines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile

from ..budget_log import LOG_ENV, drafted_summary
from ..datafiles import read_prompts
from ..errors import Eagle3Error
from ..openai_api import spec_counters, stream_completion
from .server import running_server
from .speculative import speculative_config


def measure_in_turn(urls: dict, model: str, prompts: list[str], max_tokens: int, rounds: int) -> dict:
    """``{name: (median tokens/s over the rounds, mean acceptance length or None, each round's texts)}`` for the
    servers at ``urls`` (``{name: url}``). Each round every server in turn (who goes first rotates) gets every
    prompt, one request at a time, after one untimed request: the first request after another server's turn runs
    up to 4x slower on this kind of machine (cold caches), whichever server it is. Turns are whole rounds for the
    same reason. The acceptance length counts the timed requests only."""
    names = list(urls)
    speeds, texts = {name: [] for name in names}, {name: [] for name in names}
    drafts, accepted = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            stream_completion(urls[name], model, prompts[-1], max_tokens)  # the turn's warm-up, not timed
            before = spec_counters(urls[name])
            done = [stream_completion(urls[name], model, p, max_tokens) for p in prompts]
            after = spec_counters(urls[name])
            if before and after:
                spent = after.minus(before)
                drafts[name] += spent.num_drafts
                accepted[name] += spent.num_accepted_tokens
            speeds[name].append(sum(c.tokens for c in done) / sum(c.seconds for c in done))
            texts[name].append([c.text for c in done])
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{speeds[n][-1]:.1f}" for n in names) + " tokens/s",
              file=sys.stderr)
    return {name: (statistics.median(speeds[name]), 1 + accepted[name] / drafts[name] if drafts[name] else None,
                   texts[name]) for name in names}


def describe(spec: dict) -> str:
    if "mode" not in spec:
        return f"vLLM's native EAGLE-3 chain of {spec.get('num_speculative_tokens')}"
    if spec["mode"] == "chain":
        return f"EAGLE-3 chain of {spec['depth']} (eagle3-plugin, {spec.get('budget', 'auto')} budget)"
    return (f"EAGLE-3 dynamic tree, depth {spec['depth']}, top_k {spec['top_k']}, {spec['total_tokens']} tokens/round "
            f"(eagle3-plugin, {spec.get('budget', 'auto')} budget)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--speculative-config", required=True, help="eagle3.json path or JSON (ours or vLLM's)")
    p.add_argument("--prompts", required=True)
    p.add_argument("--max-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=5, help="rounds over the prompts, each server in turn (median kept)")
    a = p.parse_args(argv)
    try:
        spec_json = speculative_config(a.speculative_config)
        prompts = [r.prompt for r in read_prompts(a.prompts)[: a.max_prompts]]
    except Eagle3Error as e:
        print(f"demo: error: {e}", file=sys.stderr)
        return 2
    common = ["--dtype", "float32", "--max-model-len", "2048"]
    native = spec_json  # vLLM's own config compares with itself
    if "mode" in spec_json:
        native = {"method": "eagle3", "model": spec_json["draft"], "num_speculative_tokens": spec_json["depth"]}
    servers = {"no speculation": [], describe(native): ["--speculative-config", json.dumps(native)],
               describe(spec_json): ["--speculative-config", json.dumps(spec_json)]}
    logs = tempfile.mkdtemp(prefix="eagle3-serve-")
    os.environ.setdefault(LOG_ENV, os.path.join(logs, "budget.jsonl"))  # only our server has a budget
    print(f"starting {len(servers)} vLLM servers on 127.0.0.1 (logs in {logs}; our budget's choices in "
          f"{os.environ[LOG_ENV]}) ...", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(running_server(a.target, common + args,
                                                         os.path.join(logs, f"server{i}.log")))
                for i, (name, args) in enumerate(servers.items())}
        results = measure_in_turn(urls, a.target, prompts, a.max_new_tokens, a.rounds)
    (base_tps, _, base_texts), (native_tps, _, _) = results["no speculation"], results[describe(native)]
    print(f"## vllm serve on 127.0.0.1: {len(prompts)} requests one at a time, {a.max_new_tokens} tokens each, "
          f"greedy; servers up together, measured in turn, median of {a.rounds} rounds\n")
    print("| server | tokens/s | vs no speculation | vs native chain | mean acceptance length |")
    print("|---|---:|---:|---:|---:|")
    for name, (tps, mal, _) in results.items():
        print(f"| {name} | {tps:.1f} | {tps / base_tps:.2f}x | {tps / native_tps:.2f}x | "
              f"{'' if mal is None else f'{mal:.3f}'} |")
    same = all(texts == base_texts[0] for _, _, rounds in results.values() for texts in rounds)
    print(f"\noutputs identical to no speculation: {'yes' if same else 'NO'}")
    if os.path.exists(os.environ[LOG_ENV]):  # an auto budget: say what it drafted, which the row's name does not
        print(drafted_summary(os.environ[LOG_ENV], "our server's auto budget"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
