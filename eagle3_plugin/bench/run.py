"""``eagle3 bench``: the same prompts without and with speculation, side by side in one run."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from typing import Optional

from tqdm import tqdm

from ..config import Eagle3Config
from ..datafiles import encode_prompt, read_prompts
from ..errors import Eagle3Error
from .engines import open_engine
from .report import PromptResult, build_report, markdown, plot


@dataclass
class BenchArgs:
    engine: str
    target: str
    draft: str
    prompts: str
    max_prompts: Optional[int] = None
    max_new_tokens: int = 64
    temperature: float = 0.0
    chain: Optional[int] = None
    tree: Optional[tuple] = None
    tree_sampler: Optional[str] = None
    budget: str = "fixed"
    seed: int = 0
    engine_args: tuple = ()
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


def bench(args: BenchArgs) -> dict:
    from transformers import AutoTokenizer

    if args.temperature < 0:
        raise Eagle3Error(f"--temperature must be >= 0, got {args.temperature}")
    records = read_prompts(args.prompts)[: args.max_prompts]
    config = speculation_config(args)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    prompts = [encode_prompt(tokenizer, r.prompt) for r in records]
    if args.engine_args and args.engine == "reference":
        raise Eagle3Error("--engine-args is for --engine vllm or sglang (extra engine or server arguments)")
    engine = open_engine(args.engine, args.target, config, args.engine_args)
    try:
        outputs = {}  # all prompts without speculation, then all with it (an engine may hold one mode at a time)
        with tqdm(total=2 * len(prompts), desc=f"bench {args.engine}", unit="generation", file=sys.stderr) as bar:
            for speculative in (False, True):
                # warm-up, not timed: a whole first generation, so neither mode's one-off costs land in its timing
                engine.generate(prompts[0], args.max_new_tokens, args.temperature, speculative, args.seed, None)
                for i, prompt in enumerate(prompts):
                    outputs[speculative, i] = engine.generate(prompt, args.max_new_tokens, args.temperature,
                                                              speculative, args.seed + i, tokenizer.eos_token_id)
                    bar.update()
        results = [PromptResult(record.category, outputs[True, i].tokens, outputs[False, i].tokens,
                                outputs[True, i].seconds, outputs[False, i].seconds, outputs[True, i].stats)
                   for i, record in enumerate(records)]
    finally:
        engine.close()
    settings = {"depth": config.depth, "top_k": config.top_k, "total_tokens": config.total_tokens,
                "tree_sampler": config.tree_sampler, "budget": config.budget, "max_new_tokens": args.max_new_tokens,
                "seed": args.seed, "target": args.target, "draft": args.draft, "prompts": args.prompts}
    report = build_report(results, engine=args.engine, mode=config.mode, temperature=args.temperature,
                          depth=config.depth, settings=settings)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if args.plot_out:
        plot(report, args.plot_out)
    print(markdown(report))
    return report
