"""speculators (vLLM project) ``eagle3``: tensors renamed ``midlayer.`` -> ``layers.0.``, a config with
``speculators_model_type: "eagle3"``, the layer config under ``transformer_layer_config``, and capture
ids in vLLM's convention (= ours)."""

from __future__ import annotations

import os

from ..checkpoint import parse_draft_config
from ..draft import DraftConfig
from .canonical import CanonicalDraft, has_config, read_json, require_layer_ids, save, split_tensors

NAME = "speculators"
VERSION = "0.3.0"


def detect(folder: str) -> bool:
    return has_config(folder) and read_json(os.path.join(folder, "config.json")).get("speculators_model_type") == "eagle3"


def read(folder: str) -> CanonicalDraft:
    where = os.path.join(folder, "config.json")
    data = read_json(where)
    layer = dict(data.get("transformer_layer_config") or {})
    layer.update(draft_vocab_size=data.get("draft_vocab_size"), target_hidden_size=data.get("target_hidden_size"))
    config = parse_draft_config(layer, where)
    tensors, embed = split_tensors(folder, config, rename=lambda k: k.replace("layers.0.", "midlayer.", 1))
    ids = data.get("eagle_aux_hidden_state_layer_ids")
    return CanonicalDraft(config, tensors, tuple(ids) if ids else None, embed)


def write(draft: CanonicalDraft, folder: str, progress=None, shard_bytes=None) -> None:
    c: DraftConfig = draft.config
    layer = c.to_json_dict()
    for key in ("draft_vocab_size", "target_hidden_size", "architectures"):
        layer.pop(key)
    depth = draft.speculation.get("depth", 3)
    config = {
        "speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer, "draft_vocab_size": c.draft_vocab_size, "norm_before_residual": False,
        "target_hidden_size": c.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(require_layer_ids(draft, NAME)),
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": depth}],
                               "verifier": {"name_or_path": None, "architectures": []}},
        "speculators_version": VERSION,
    }
    weights = draft.weights(rename=lambda k: k.replace("midlayer.", "layers.0.", 1))
    save(folder, draft, config, weights, progress, shard_bytes)
