"""SpecForge's export, which is also the layout SGLang loads: official tensor names without embeddings,
``architectures: ["LlamaForCausalLMEagle3"]`` and capture ids in SGLang's convention under
``eagle_config.eagle_aux_hidden_state_layer_ids`` (our id = SGLang id + 1)."""

from __future__ import annotations

import os

from ..capture_ids import from_ours, to_ours
from ..checkpoint import parse_draft_config
from .canonical import CanonicalDraft, has_config, read_json, require_layer_ids, save, split_tensors

NAME = "specforge"


def detect(folder: str) -> bool:
    return has_config(folder) and isinstance(read_json(os.path.join(folder, "config.json")).get("eagle_config"), dict)


def read(folder: str) -> CanonicalDraft:
    where = os.path.join(folder, "config.json")
    data = read_json(where)
    config = parse_draft_config(data, where)
    tensors, embed = split_tensors(folder, config)
    ids = data["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
    return CanonicalDraft(config, tensors, to_ours(ids, "sglang") if ids else None, embed)


def write(draft: CanonicalDraft, folder: str, progress=None, shard_bytes=None) -> None:
    ids = list(from_ours(require_layer_ids(draft, NAME), "sglang"))
    config = draft.config.to_json_dict() | {"architectures": ["LlamaForCausalLMEagle3"],
                                             "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}
    save(folder, draft, config, draft.weights(), progress, shard_bytes)
