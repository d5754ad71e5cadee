"""Ours: the vLLM-ready layout plus ``eagle3.json`` (speculation settings and capture ids)."""

from __future__ import annotations

import os

from ..config import CONFIG_FILENAME, Eagle3Config
from . import vllm
from .canonical import CanonicalDraft, has_config, read_json, require_layer_ids, write_json

NAME = "ours"


def detect(folder: str) -> bool:
    return has_config(folder) and os.path.isfile(os.path.join(folder, CONFIG_FILENAME))


def read(folder: str) -> CanonicalDraft:
    settings = Eagle3Config.from_dict(read_json(os.path.join(folder, CONFIG_FILENAME)),
                                      source=os.path.join(folder, CONFIG_FILENAME))
    draft = vllm.read(folder) if vllm.detect(folder) else _without_ids(folder)
    draft.layer_ids = settings.layer_ids or draft.layer_ids
    draft.speculation = {k: v for k, v in settings.to_dict().items() if k not in ("draft", "layer_ids")}
    return draft


def _without_ids(folder: str) -> CanonicalDraft:
    from . import eagle
    return eagle.read(folder)


def write(draft: CanonicalDraft, folder: str, progress=None) -> None:
    vllm.write(draft, folder, progress)
    settings = Eagle3Config(**{**draft.speculation, "layer_ids": require_layer_ids(draft, NAME)})
    write_json(os.path.join(folder, CONFIG_FILENAME), settings.to_dict())
