"""Our ``eagle3.json`` as vLLM's ``speculative_config`` (for ``LLM(...)`` and the server launcher)."""

from __future__ import annotations

import json
import os

from ..config import Eagle3Config
from ..errors import Eagle3Error

OUR_KEYS = {"mode", "depth", "top_k", "total_tokens", "tree_sampler", "layer_ids", "draft"}


def speculative_config(value) -> dict:
    """``value``: a path to ``eagle3.json`` (or its folder), our config as a dict / JSON string, or vLLM's
    own speculative-config dict / JSON (passed through unchanged)."""
    if isinstance(value, str) and os.path.exists(value):
        return to_vllm(Eagle3Config.load(value))
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise Eagle3Error(f"--speculative-config: {value!r} is neither a file nor JSON") from None
    if not isinstance(value, dict):
        raise Eagle3Error("--speculative-config must be a path to eagle3.json or a JSON object")
    if "method" in value or not (set(value) & OUR_KEYS):
        return value
    config = Eagle3Config.from_dict(value, source="--speculative-config")
    return to_vllm(config)


def to_vllm(config: Eagle3Config) -> dict:
    """vLLM drafts chains with its own EAGLE-3 proposer; our tree worker for vLLM does not exist yet."""
    if config.mode != "chain":
        raise Eagle3Error("mode 'tree' is not available in vLLM yet (only the reference generator drafts trees); "
                          "set \"mode\": \"chain\" for vLLM")
    _check_layer_ids(config)
    return {"method": "eagle3", "model": config.draft, "num_speculative_tokens": config.depth}


def _check_layer_ids(config: Eagle3Config) -> None:
    """vLLM reads capture ids from the draft's config.json: they must agree with eagle3.json's."""
    path = os.path.join(config.draft, "config.json")
    try:
        with open(path) as f:
            in_draft = json.load(f).get("eagle_aux_hidden_state_layer_ids")
    except (OSError, json.JSONDecodeError) as e:
        raise Eagle3Error(f"{path}: cannot read the draft config ({e})") from None
    if config.layer_ids is not None and (in_draft is None or tuple(in_draft) != tuple(config.layer_ids)):
        raise Eagle3Error(f"{path}: eagle_aux_hidden_state_layer_ids {in_draft} differs from eagle3.json's "
                          f"layer_ids {list(config.layer_ids)} (vLLM reads config.json)")
