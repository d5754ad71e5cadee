"""The main job: serve a target with vLLM + EAGLE-3 on 127.0.0.1, send requests, report, stop.

    python -m eagle3_plugin.vllm.serve_demo --target DIR --speculative-config CONFIG --prompts FILE

Runs the same prompts one at a time against a server without speculation, one with vLLM's native EAGLE-3 chain
(same draft, depth as ours) and one with our config, one server at a time, and prints tokens/s of each, their
ratios, and the mean acceptance length from each server's own ``/metrics``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from ..datafiles import read_prompts
from ..errors import Eagle3Error
from ..openai_api import spec_counters, stream_completion
from .server import running_server
from .speculative import speculative_config


def serve_and_measure(target: str, args: list[str], prompts: list[str], max_tokens: int, log: str):
    with running_server(target, args, log) as url:
        stream_completion(url, target, prompts[0], max_tokens)  # warm-up, not timed
        before = spec_counters(url)
        done = [stream_completion(url, target, p, max_tokens) for p in prompts]
        after = spec_counters(url)
    tokens, seconds = sum(c.tokens for c in done), sum(c.seconds for c in done)
    spent = after.minus(before) if after else None
    mal = 1 + spent.num_accepted_tokens / spent.num_drafts if spent and spent.num_drafts else None
    return tokens / seconds, mal, [c.text for c in done]


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
    a = p.parse_args(argv)
    try:
        spec_json = speculative_config(a.speculative_config)
        prompts = [r.prompt for r in read_prompts(a.prompts)[: a.max_prompts]]
    except Eagle3Error as e:
        print(f"serve_demo: error: {e}", file=sys.stderr)
        return 2
    common = ["--dtype", "float32", "--max-model-len", "2048"]
    native = spec_json  # vLLM's own config compares with itself
    if "mode" in spec_json:
        native = {"method": "eagle3", "model": spec_json["draft"], "num_speculative_tokens": spec_json["depth"]}
    servers = {"no speculation": [], describe(native): ["--speculative-config", json.dumps(native)],
               describe(spec_json): ["--speculative-config", json.dumps(spec_json)]}
    logs = tempfile.mkdtemp(prefix="eagle3-serve-")
    print(f"starting vLLM servers on 127.0.0.1, one at a time (logs in {logs}) ...", file=sys.stderr)
    results = {name: serve_and_measure(a.target, common + args, prompts, a.max_new_tokens,
                                       os.path.join(logs, f"server{i}.log"))
               for i, (name, args) in enumerate(servers.items())}
    (base_tps, _, base_text), (native_tps, _, _) = results["no speculation"], results[describe(native)]
    print(f"## vllm serve on 127.0.0.1: {len(prompts)} requests one at a time, {a.max_new_tokens} tokens each, "
          "greedy\n")
    print("| server | tokens/s | vs no speculation | vs native chain | mean acceptance length |")
    print("|---|---:|---:|---:|---:|")
    for name, (tps, mal, _) in results.items():
        print(f"| {name} | {tps:.1f} | {tps / base_tps:.2f}x | {tps / native_tps:.2f}x | "
              f"{'' if mal is None else f'{mal:.3f}'} |")
    same = all(text == base_text for _, _, text in results.values())
    print(f"\noutputs identical to no speculation: {'yes' if same else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
