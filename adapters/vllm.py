"""vLLM-ready: official tensor names and top-level ``eagle_aux_hidden_state_layer_ids`` (vLLM's ids
are ours). vLLM 0.32 refuses ``d2t`` for a full-vocabulary draft, so those drafts are written without
``d2t``/``t2d``."""

from __future__ import annotations

import os

from ..checkpoint import parse_draft_config
from .canonical import CanonicalDraft, has_config, read_json, require_layer_ids, save, split_tensors

NAME = "vllm"


def detect(folder: str) -> bool:
    return has_config(folder) and "eagle_aux_hidden_state_layer_ids" in read_json(os.path.join(folder, "config.json"))


def read(folder: str) -> CanonicalDraft:
    where = os.path.join(folder, "config.json")
    data = read_json(where)
    config = parse_draft_config(data, where)
    tensors, embed = split_tensors(folder, config)
    return CanonicalDraft(config, tensors, tuple(data["eagle_aux_hidden_state_layer_ids"]), embed)


def write(draft: CanonicalDraft, folder: str, progress=None, shard_bytes=None) -> None:
    config = draft.config.to_json_dict() | {"architectures": ["LlamaForCausalLMEagle3"],
                                             "eagle_aux_hidden_state_layer_ids": list(require_layer_ids(draft, NAME))}
    full = draft.config.draft_vocab_size == draft.config.vocab_size
    save(folder, draft, config, draft.weights(drop=("d2t", "t2d") if full else ()), progress, shard_bytes)
