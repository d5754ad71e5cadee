"""Paths of the bundled checkpoint, the bench settings its committed baselines were made with, and prompts built
from its held-out set."""

import os

import torch
from transformers import AutoModelForCausalLM

from eagle3_plugin.datafiles import encode_prompt, read_prompts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "checkpoints", "target")
DRAFT = os.path.join(ROOT, "checkpoints", "draft")
HELDOUT = os.path.join(ROOT, "checkpoints", "prompts", "heldout.jsonl")
BASELINES = os.path.join(ROOT, "checkpoints", "baselines")

# `eagle3 bench` arguments shared by the committed baselines and the regression tests.
BENCH_ARGS = ["--target", TARGET, "--prompts", HELDOUT, "--max-prompts", "8", "--max-new-tokens", "48"]


def shared_prefix_prompts(tokenizer, count: int = 6, prefix_tokens: int = 200) -> list:
    """``count`` prompts (token ids): one ``prefix_tokens``-token prefix (held-out code), then each its own held-out
    prompt (without its BOS)."""
    records = read_prompts(HELDOUT)
    prefix = []
    for r in records[20:]:
        prefix += encode_prompt(tokenizer, r.prompt)
        if len(prefix) >= prefix_tokens:
            break
    return [prefix[:prefix_tokens] + encode_prompt(tokenizer, r.prompt)[1:] for r in records[:count]]


def hf_greedy(prompts, max_new_tokens: int) -> list:
    """Transformers' greedy continuation of each prompt (token ids) by the bundled target, in float32, no EOS."""
    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype="float32").eval()
    return [target.generate(input_ids=torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                            pad_token_id=2, eos_token_id=None)[0, len(ids):].tolist() for ids in prompts]
