"""A tiny Glm4 target (vLLM's Glm4ForCausalLM has no SupportsEagle3) and an EAGLE-3 draft trained for it."""

import json
import os
import shutil

import torch
from transformers import Glm4Config, Glm4ForCausalLM

from bundled import ROOT, TARGET
from eagle3_plugin.train.loop import TrainArgs, train

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def build_glm4_target(out: str) -> str:
    torch.manual_seed(0)
    config = Glm4Config(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
                        bos_token_id=0, eos_token_id=1, pad_token_id=2)
    model = Glm4ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # peaked next-token distributions: greedy is well defined
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(TARGET, name), out)
    return out


def train_draft_for(target: str, out: str, work: str) -> str:
    data = os.path.join(work, "prompts.jsonl")
    with open(os.path.join(ROOT, "checkpoints", "prompts", "train_prompts.jsonl")) as src, open(data, "w") as dst:
        for line in list(src)[:160]:
            dst.write(json.dumps({"prompt": json.loads(line)["prompt"][:120]}) + "\n")
    train(TrainArgs(target=target, data=[data], out=out, draft_vocab=512, max_steps=400, ttt_steps=3,
                    batch_size=8, regenerate=True, regen_tokens=48, layers=(1, 3, 5)))
    return out
