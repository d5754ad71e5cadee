"""Load and save drafts in our layout (official EAGLE names, safetensors), validating everything.

Our layout: ``config.json`` (:class:`DraftConfig` as a 1-layer Llama config), ``model.safetensors`` and
``eagle3.json``. Reading also takes sharded safetensors (``model.safetensors.index.json``) and pickled
``pytorch_model.bin`` files, the latter only through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

from .capture_ids import LayerIdError, validate_layer_ids
from .config import CONFIG_FILENAME, Eagle3Config
from .draft import DraftConfig, Eagle3Draft
from .errors import Eagle3Error
from .fsutil import atomic_directory, read_json_object
from .weights import all_finite, open_tensors

OPTIONAL_KEYS = ("embed_tokens.weight",)


def read_tensors(folder: str) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint in ``folder``: safetensors (single or sharded) or a safe ``.bin``."""
    return {name: t.load() for name, t in open_tensors(folder).items()}


def read_draft_config(folder: str) -> DraftConfig:
    path = os.path.join(folder, "config.json")
    return parse_draft_config(read_json_object(path, "draft config"), path)


def parse_draft_config(data: dict, where: str) -> DraftConfig:
    try:
        return DraftConfig.from_json_dict(data)
    except KeyError as e:
        raise Eagle3Error(f"{where}: missing field(s) {e.args[0]}") from None
    except TypeError as e:
        raise Eagle3Error(f"{where}: bad draft config ({e})") from None


def validate_vocab_mapping(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int, where: str) -> None:
    """``d2t + arange`` strictly increasing within the vocab, and ``t2d`` marking exactly those ids.

    A full-vocabulary draft may have an all-zero ``d2t`` (the identity map) and an all-true ``t2d``.
    """
    draft_vocab = d2t.shape[0]
    if d2t.dtype not in (torch.int64, torch.int32) or t2d.dtype != torch.bool:
        raise Eagle3Error(f"{where}: d2t must be int64 and t2d bool, got {d2t.dtype} and {t2d.dtype}")
    hot = d2t.long() + torch.arange(draft_vocab)
    if draft_vocab > 1 and not bool((hot[1:] > hot[:-1]).all()):
        raise Eagle3Error(f"{where}: d2t + arange must be strictly increasing (draft ids map to sorted target ids)")
    if int(hot.min()) < 0 or int(hot.max()) >= vocab_size:
        raise Eagle3Error(f"{where}: d2t maps outside the target vocabulary [0, {vocab_size})")
    if int(t2d.sum()) != draft_vocab:
        raise Eagle3Error(f"{where}: t2d marks {int(t2d.sum())} tokens but the draft vocabulary has {draft_vocab}")
    if not bool(t2d[hot].all()):
        raise Eagle3Error(f"{where}: d2t and t2d disagree (a token mapped by d2t is not marked in t2d)")


def load_draft(folder: str, dtype: torch.dtype = torch.float32) -> Eagle3Draft:
    """Build an :class:`Eagle3Draft` from ``folder``; every problem is one :class:`Eagle3Error`."""
    if not os.path.isdir(folder):
        raise Eagle3Error(f"{folder}: no such draft folder")
    config = read_draft_config(folder)
    tensors = read_tensors(folder)
    draft = Eagle3Draft(config)
    expected = draft.state_dict()
    if config.draft_vocab_size == config.vocab_size:  # full vocabulary: the map may be omitted
        tensors.setdefault("d2t", expected["d2t"].clone())
        tensors.setdefault("t2d", expected["t2d"].clone())
    missing = [k for k in expected if k not in tensors]
    if missing:
        raise Eagle3Error(f"{folder}: missing tensor {missing[0]!r}" + (f" (and {len(missing) - 1} more)"
                                                                        if len(missing) > 1 else ""))
    unknown = [k for k in tensors if k not in expected and k not in OPTIONAL_KEYS]
    if unknown:
        raise Eagle3Error(f"{folder}: unknown tensor {unknown[0]!r} (not part of the EAGLE-3 draft layout)")
    for name, want in expected.items():
        got = tensors[name]
        if tuple(got.shape) != tuple(want.shape):
            raise Eagle3Error(f"{folder}: tensor {name!r} has shape {tuple(got.shape)}, "
                              f"expected {tuple(want.shape)} from config.json")
        if not all_finite(got):
            raise Eagle3Error(f"{folder}: tensor {name!r} contains NaN or Inf")
    validate_vocab_mapping(tensors["d2t"], tensors["t2d"], config.vocab_size, folder)
    draft.load_state_dict({k: tensors[k] for k in expected})
    return draft.to(dtype).eval()


def validate_against_target(draft: Eagle3Draft, target_config, layer_ids, where: str) -> tuple[int, int, int]:
    """Check the draft fits the target (hidden sizes, vocab) and the capture ids; return the ids."""
    c = draft.config
    if c.vocab_size != target_config.vocab_size:
        raise Eagle3Error(f"{where}: draft vocab_size {c.vocab_size} (d2t/t2d) does not match the target's "
                          f"{target_config.vocab_size}")
    if c.target_hidden_size != target_config.hidden_size:
        raise Eagle3Error(f"{where}: draft target_hidden_size {c.target_hidden_size} does not match the "
                          f"target's hidden_size {target_config.hidden_size}")
    if c.hidden_size != target_config.hidden_size:
        raise Eagle3Error(f"{where}: draft hidden_size {c.hidden_size} differs from the target's "
                          f"{target_config.hidden_size}, so the target's embedding cannot be shared")
    try:
        return validate_layer_ids(layer_ids, target_config.num_hidden_layers)
    except LayerIdError as e:
        raise Eagle3Error(f"{where}: {e}") from None


def save_draft(draft: Eagle3Draft, out: str, config: Eagle3Config, force: bool = False,
               extra_json: dict | None = None) -> None:
    """Write ``config.json``, ``model.safetensors``, ``eagle3.json`` (and ``extra_json`` files, by name)
    into ``out``, all or nothing."""
    with atomic_directory(out, force=force) as tmp:
        tensors = {k: v.detach().contiguous().cpu() for k, v in draft.state_dict().items()}
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        engine_config = draft.config.to_json_dict()
        if config.layer_ids is not None:  # where vLLM reads capture ids; its numbering is ours
            engine_config["eagle_aux_hidden_state_layer_ids"] = list(config.layer_ids)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(engine_config, f, indent=2)
        config.save(os.path.join(tmp, CONFIG_FILENAME))
        for name, data in (extra_json or {}).items():
            with open(os.path.join(tmp, name), "w") as f:
                json.dump(data, f, indent=2)
