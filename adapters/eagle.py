"""EAGLE official (SafeAILab/EAGLE): a 1-layer Llama config with ``draft_vocab_size``, official tensor
names, optionally ``embed_tokens``; no capture ids (EAGLE uses its default for the target)."""

from __future__ import annotations

import os

from ..checkpoint import parse_draft_config
from .canonical import CanonicalDraft, has_config, read_json, save, split_tensors

NAME = "eagle"


def detect(folder: str) -> bool:
    if not has_config(folder):
        return False
    config = read_json(os.path.join(folder, "config.json"))
    return "draft_vocab_size" in config or config.get("num_hidden_layers") == 1


def read(folder: str) -> CanonicalDraft:
    where = os.path.join(folder, "config.json")
    config = parse_draft_config(read_json(where), where)
    tensors, embed = split_tensors(folder, config)
    return CanonicalDraft(config, tensors, None, embed)


def write(draft: CanonicalDraft, folder: str, progress=None, shard_bytes=None) -> None:
    config = draft.config.to_json_dict() | {"architectures": ["LlamaForCausalLM"]}
    save(folder, draft, config, draft.weights(with_embed=True), progress, shard_bytes)
