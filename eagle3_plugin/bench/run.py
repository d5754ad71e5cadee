"""``eagle3 bench``: the same conversations without and with speculation, at one or more concurrency levels, side by
side in one run."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from typing import Optional

from ..config import Eagle3Config
from ..datafiles import read_prompts
from ..errors import Eagle3Error
from .engines import Sampling, open_engine
from .report import build_report, category_figures, level_figures, markdown, plot
from .workload import Conversation, Workload, jobs_for


@dataclass
class BenchArgs:
    engine: str
    target: str
    draft: Optional[str]
    prompts: str
    max_prompts: Optional[int] = None
    max_new_tokens: int = 64
    temperature: float = 0.0
    chain: Optional[int] = None
    tree: Optional[tuple] = None
    tree_sampler: Optional[str] = None
    budget: str = "fixed"
    seed: int = 0
    samples: int = 1
    concurrency: tuple = (1,)
    chat_template: str = "auto"
    max_turns: Optional[int] = None
    engine_args: tuple = ()
    url: Optional[str] = None
    baseline_url: Optional[str] = None
    json_out: Optional[str] = None
    plot_out: Optional[str] = None


def speculation_config(args: BenchArgs) -> Eagle3Config:
    """The draft's ``eagle3.json`` (or defaults), with ``--chain`` / ``--tree`` / ``--tree-sampler`` / ``--budget``
    applied (the budget defaults to ``fixed``: a regression check compares one tree shape's acceptance)."""
    path = os.path.join(args.draft, "eagle3.json")
    base = Eagle3Config.load(path) if os.path.exists(path) else Eagle3Config(draft=os.path.abspath(args.draft))
    changes = {"draft": os.path.abspath(args.draft), "budget": args.budget}
    if args.chain is not None and args.tree is not None:
        raise Eagle3Error("give --chain or --tree, not both")
    if args.chain is not None:
        changes.update(mode="chain", depth=args.chain, top_k=1, total_tokens=args.chain + 1)
    elif args.tree is not None:
        changes.update(mode="tree", depth=args.tree[0], top_k=args.tree[1], total_tokens=args.tree[2])
    if args.tree_sampler:
        changes["tree_sampler"] = args.tree_sampler
    try:
        return dataclasses.replace(base, **changes)
    except Eagle3Error as e:
        raise Eagle3Error(f"speculation settings: {e}") from None


def _validate(args: BenchArgs) -> None:
    if args.temperature < 0:
        raise Eagle3Error(f"--temperature must be >= 0, got {args.temperature}")
    if not args.concurrency or any(c < 1 for c in args.concurrency):
        raise Eagle3Error(f"--concurrency must be positive integers, got {list(args.concurrency)}")
    if args.max_turns is not None and args.max_turns < 1:
        raise Eagle3Error(f"--max-turns must be >= 1, got {args.max_turns}")
    if args.engine_args and args.engine == "reference":
        raise Eagle3Error("--engine-args is for --engine vllm or sglang (extra engine or server arguments)")
    if args.draft is None and args.engine != "openai":
        raise Eagle3Error(f"--engine {args.engine} needs --draft")


def bench(args: BenchArgs) -> dict:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    _validate(args)
    records = read_prompts(args.prompts)[: args.max_prompts]
    # --engine openai measures a server as it is; --draft then only names the shape it serves (for the report).
    config = speculation_config(args) if args.draft else None
    depth = config.depth if config else None
    workload = Workload(AutoTokenizer.from_pretrained(args.target), args.chat_template)
    jobs = jobs_for(records, args.samples, args.seed, args.max_turns)
    sampling = Sampling(args.max_new_tokens, args.temperature, workload.tokenizer.eos_token_id)
    engine = open_engine(args.engine, args.target, config, args.engine_args, args.url, args.baseline_url, depth)
    modes = (False, True) if args.engine != "openai" or args.baseline_url else (True,)
    runs = {}
    try:
        # Mode by mode (an engine may hold one mode at a time), each level in turn; a whole first conversation,
        # not timed, warms each mode up so neither mode's one-off costs land in its timing.
        with tqdm(total=len(modes) * len(args.concurrency), desc=f"bench {args.engine}", unit="run",
                  file=sys.stderr) as bar:
            for speculative in modes:
                engine.run([Conversation(jobs[0], workload)], sampling, speculative, 1)
                for concurrency in args.concurrency:
                    runs[speculative, concurrency] = engine.run([Conversation(j, workload) for j in jobs], sampling,
                                                                speculative, concurrency)
                    bar.update()
    finally:
        engine.close()
    depth = depth or _served_depth(runs)
    levels = [level_figures(c, runs[True, c].records, runs[False, c].records if False in modes else None, depth,
                            runs[True, c].aggregate) for c in args.concurrency]
    first = args.concurrency[0]
    categories = category_figures(runs[True, first].records, runs[False, first].records if False in modes else None,
                                  depth)
    settings = {"depth": depth, "top_k": config.top_k if config else None,
                "total_tokens": config.total_tokens if config else None,
                "tree_sampler": config.tree_sampler if config else None, "budget": config.budget if config else None,
                "max_new_tokens": args.max_new_tokens, "seed": args.seed, "samples": args.samples,
                "concurrency": list(args.concurrency), "chat_template": workload.template_name,
                "max_turns": args.max_turns, "target": args.target, "draft": args.draft, "prompts": args.prompts,
                "url": args.url, "baseline_url": args.baseline_url}
    report = build_report(levels, categories, engine=args.engine, mode=config.mode if config else "served",
                          temperature=args.temperature, num_prompts=len(records), settings=settings)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if args.plot_out:
        plot(report, args.plot_out)
    print(markdown(report))
    return report


def _served_depth(runs: dict) -> int:
    """Without --draft: the depth the server's own counters span."""
    aggregate = next((r.aggregate for r in runs.values() if r.aggregate is not None), None)
    return aggregate.depth if aggregate else 0
