"""Greedy outputs of the real SGLang CPU server: no speculation vs EAGLE-3 chains and trees, stock and ours.

    .venv-sglang/bin/python tests/sglang_support/compare_greedy.py --out /tmp/sgl_compare.json

Settings: ``none``; ``stock-chain`` / ``stock-tree`` (stock SGLang: eagle3-plugin left out through
SGLANG_PLUGINS); ``chain`` / ``tree`` (eagle3-plugin, fixed budget: every step drafts the configured shape);
``auto`` (eagle3-plugin started from the bundled ``eagle3.json`` alone: its tree, the auto budget). Stock
settings and our chain load the draft converted to SGLang's layout by our converter (capture ids = ours - 1 under
eagle_config); our tree and auto read our layout, their shape from the bundled ``eagle3.json``. Servers run one at
a time, requests one at a time (batch size 1). Prints one JSON summary: per-setting outputs, whether they equal the
first setting's, the mean acceptance length 1 + accepted drafts / verify rounds (plus SGLang's completion_tokens /
rounds), and our worker's timings (steps by phase and by drafted shape).
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import STOCK_PLUGINS, SGLangServer, fixed_budget_config  # noqa: E402

from eagle3_plugin.timings import FILE_ENV  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHAIN = ["--speculative-num-steps", "5", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "6"]
TREE = ["--speculative-num-steps", "5", "--speculative-eagle-topk", "8", "--speculative-num-draft-tokens", "32"]
SETTINGS = {  # name: (draft: converted, ours or none; fixed budget?, flags, SGLANG_PLUGINS)
    "none": (None, False, [], None),
    "stock-chain": ("converted", False, CHAIN, STOCK_PLUGINS),
    "stock-tree": ("converted", False, TREE, STOCK_PLUGINS),
    "chain": ("converted", True, CHAIN, None),
    "tree": ("ours", True, [], None),
    "auto": ("ours", False, [], None),
}


def prompt_ids(target: str, prompts: str, count: int) -> list:
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(target)
    with open(prompts) as f:
        texts = [json.loads(line)["prompt"] for line in f if line.strip()][:count]
    return [tokenizer.encode(t) for t in texts]


def run_setting(name, target, draft, converted, prompts, max_new_tokens, log_dir):
    source, fixed, flags, plugins = SETTINGS[name]
    draft = converted if source == "converted" else draft
    path = fixed_budget_config(draft, os.path.join(log_dir, f"{name}-fixed.json")) if fixed else (
        draft if source == "converted" else os.path.join(draft, "eagle3.json"))
    extra = [] if source is None else ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", path,
                                       *flags]
    params = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
    timings = os.path.join(log_dir, f"timings-{name}.json")
    os.environ[FILE_ENV] = timings  # our worker's steps by phase and shape, rewritten after every step
    with SGLangServer(target, extra, log_path=os.path.join(log_dir, f"server-{name}.log"), plugins=plugins) as server:
        results = [server.generate(ids, params) for ids in prompts]
    if not os.path.exists(timings):
        return results, None
    with open(timings) as f:
        return results, json.load(f)


def summarize(results, timings, reference):
    outputs = [r["output_ids"] for r in results]
    summary = {"outputs": outputs, "identical_to_reference": outputs == reference, "worker_timings": timings}
    metas = [r["meta_info"] for r in results]
    if all("spec_verify_ct" in m for m in metas):
        rounds = sum(m["spec_verify_ct"] for m in metas)
        accepted = sum(m["spec_num_correct_drafts"] for m in metas)
        completion = sum(m["completion_tokens"] for m in metas)
        summary |= {"verify_rounds": rounds, "accepted_drafts": accepted, "completion_tokens": completion,
                    "mean_acceptance_length": 1 + accepted / rounds,
                    "sglang_spec_accept_length": completion / rounds}
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=os.path.join(ROOT, "checkpoints/target"))
    p.add_argument("--draft", default=os.path.join(ROOT, "checkpoints/draft"))
    p.add_argument("--prompts", default=os.path.join(ROOT, "checkpoints/prompts/heldout.jsonl"))
    p.add_argument("--num-prompts", type=int, default=6)
    p.add_argument("--prompt-ids", help="JSON file with a list of token-id lists (instead of --prompts)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--settings", default="none,stock-chain,stock-tree,chain,tree,auto")
    p.add_argument("--log-dir", default=tempfile.gettempdir())
    p.add_argument("--out")
    a = p.parse_args(argv)

    from eagle3_plugin.convert import convert
    if a.prompt_ids:
        with open(a.prompt_ids) as f:
            prompts = json.load(f)
    else:
        prompts = prompt_ids(a.target, a.prompts, a.num_prompts)
    names = a.settings.split(",")
    report = {"prompt_lengths": [len(x) for x in prompts], "max_new_tokens": a.max_new_tokens,
              "reference_setting": names[0]}
    with tempfile.TemporaryDirectory() as tmp:
        converted = os.path.join(tmp, "draft-sglang")
        convert(a.draft, "sglang", converted, target=a.target)
        reference = None
        for name in names:
            results, timings = run_setting(name, a.target, a.draft, converted, prompts, a.max_new_tokens,
                                           a.log_dir)
            reference = reference or [r["output_ids"] for r in results]
            report[name] = summarize(results, timings, reference)
    text = json.dumps(report, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text)
    return 0 if all(report[n]["identical_to_reference"] for n in names) else 1


if __name__ == "__main__":
    sys.exit(main())
