"""The canonical in-memory draft every adapter reads into and writes from, with its validation."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..capture_ids import LayerIdError, validate_layer_ids
from ..checkpoint import validate_vocab_mapping
from ..config import CONFIG_FILENAME, Eagle3Config
from ..draft import DraftConfig, Eagle3Draft
from ..errors import Eagle3Error
from ..fsutil import read_json_object
from ..weights import LazyTensor, all_finite, open_tensors

EMBED = "embed_tokens.weight"


@dataclass
class CanonicalDraft:
    """Official EAGLE-3 tensor names (``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``),
    loaded lazily; ``layer_ids`` in our rule (None when the source format does not record them)."""

    config: DraftConfig
    tensors: dict[str, LazyTensor]
    layer_ids: Optional[tuple] = None
    embed_tokens: Optional[LazyTensor] = None
    speculation: dict = field(default_factory=dict)  # eagle3.json settings other than draft / layer_ids

    def expected_shapes(self) -> dict[str, tuple]:
        with torch.device("meta"):
            return {k: tuple(v.shape) for k, v in Eagle3Draft(self.config).state_dict().items()}

    def problems(self, target_config=None) -> list[str]:
        """Every problem found (empty when the draft is valid); loads only d2t and t2d."""
        found = []
        expected = self.expected_shapes()
        found += [f"missing tensor {k!r}" for k in expected if k not in self.tensors]
        found += [f"unknown tensor {k!r}" for k in self.tensors if k not in expected]
        for name, shape in expected.items():
            t = self.tensors.get(name)
            if t is not None and t.shape != shape:
                found.append(f"tensor {name!r} has shape {t.shape}, expected {shape} from the config")
            if t is not None and name not in ("d2t", "t2d") and not t.dtype.is_floating_point:
                found.append(f"tensor {name!r} has dtype {t.dtype}, expected a floating type")
        if self.embed_tokens is not None and self.embed_tokens.shape != (self.config.vocab_size,
                                                                         self.config.hidden_size):
            found.append(f"embed_tokens has shape {self.embed_tokens.shape}")
        if not any("d2t" in p or "t2d" in p for p in found):
            try:
                validate_vocab_mapping(self.tensors["d2t"].load(), self.tensors["t2d"].load(),
                                       self.config.vocab_size, "vocab mapping")
            except Eagle3Error as e:
                found.append(str(e))
        if target_config is not None:
            found += self._target_problems(target_config)
        elif self.layer_ids is not None:
            if len(set(self.layer_ids)) != 3:
                found.append(f"layer ids {list(self.layer_ids)} are not three distinct layers")
        return found

    def _target_problems(self, target) -> list[str]:
        found = []
        c = self.config
        if c.vocab_size != target.vocab_size:
            found.append(f"vocab_size {c.vocab_size} differs from the target's {target.vocab_size}")
        if c.target_hidden_size != target.hidden_size:
            found.append(f"target_hidden_size {c.target_hidden_size} differs from the target's {target.hidden_size}")
        if self.layer_ids is not None:
            try:
                validate_layer_ids(self.layer_ids, target.num_hidden_layers)
            except LayerIdError as e:
                found.append(str(e))
        return found

    def build(self, dtype: torch.dtype = torch.float32) -> Eagle3Draft:
        """The draft as a module (eval mode), after every check of :meth:`problems` and finite weights."""
        problems = self.problems()
        if problems:
            raise Eagle3Error("; ".join(problems))
        state = {}
        for name, t in self.tensors.items():
            state[name] = t.load()
            if state[name].dtype.is_floating_point:
                self.check_finite(name, state[name])
        draft = Eagle3Draft(self.config)
        draft.load_state_dict(state)
        return draft.to(dtype).eval()

    def check_finite(self, name: str, x: torch.Tensor) -> None:
        if not all_finite(x):
            raise Eagle3Error(f"tensor {name!r} contains NaN or Inf")

    def weights(self, rename=lambda name: name, drop=(), with_embed: bool = False) -> dict[str, LazyTensor]:
        """The tensors to write, renamed for a format; ``d2t``/``t2d`` synthesised for full-vocab drafts."""
        out = {rename(k): v for k, v in self.tensors.items() if k not in drop}
        if with_embed and self.embed_tokens is not None:
            out[EMBED] = self.embed_tokens
        return out


def read_json(path: str) -> dict:
    return read_json_object(path)


def write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def split_tensors(folder: str, config: DraftConfig, rename=lambda name: name):
    """``(tensors, embed_tokens)`` with official names; full-vocab drafts get an identity map if absent."""
    tensors = {rename(k): v for k, v in open_tensors(folder).items()}
    embed = tensors.pop(EMBED, None)
    if config.draft_vocab_size == config.vocab_size:
        tensors.setdefault("d2t", _const(torch.zeros(config.draft_vocab_size, dtype=torch.long)))
        tensors.setdefault("t2d", _const(torch.ones(config.vocab_size, dtype=torch.bool)))
    return tensors, embed


def _const(x: torch.Tensor) -> LazyTensor:
    return LazyTensor(tuple(x.shape), x.dtype, lambda: x)


def has_config(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "config.json"))


def save(folder: str, draft: CanonicalDraft, config_json: dict, weights: dict[str, LazyTensor], progress=None,
         shard_bytes: Optional[int] = None) -> None:
    """``config.json`` for the engine, a streamed ``model.safetensors`` (each tensor checked for NaN/Inf on
    the way) and our ``eagle3.json`` beside them (engines ignore it; it keeps settings and capture ids)."""
    from ..weights import write_safetensors
    write_json(os.path.join(folder, "config.json"), config_json)
    shards = _shards(weights, shard_bytes)
    if len(shards) == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), weights, metadata={"format": "pt"},
                          on_tensor=draft.check_finite, progress=progress)
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(os.path.join(folder, name), shard, metadata={"format": "pt"},
                              on_tensor=draft.check_finite, progress=progress)
            weight_map.update({k: name for k in shard})
        write_json(os.path.join(folder, "model.safetensors.index.json"),
                   {"metadata": {"total_size": sum(t.nbytes for t in weights.values())}, "weight_map": weight_map})
    settings = {k: v for k, v in draft.speculation.items() if k not in ("draft", "layer_ids")}
    write_json(os.path.join(folder, CONFIG_FILENAME), Eagle3Config(**settings, layer_ids=draft.layer_ids).to_dict())


def _shards(weights: dict[str, LazyTensor], shard_bytes: Optional[int]) -> list[dict[str, LazyTensor]]:
    """Consecutive groups of at most ``shard_bytes`` (a larger tensor gets a shard of its own)."""
    shards: list[dict[str, LazyTensor]] = [{}]
    size = 0
    for name, t in weights.items():
        if shard_bytes and shards[-1] and size + t.nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.nbytes
    return shards


def apply_sidecar(folder: str, draft: CanonicalDraft) -> CanonicalDraft:
    """Take speculation settings (and capture ids the format lacks) from ``eagle3.json`` when present."""
    path = os.path.join(folder, CONFIG_FILENAME)
    if not os.path.isfile(path):
        return draft
    settings = Eagle3Config.from_dict(read_json(path), source=path)
    if settings.layer_ids is not None:
        if draft.layer_ids is not None and tuple(draft.layer_ids) != settings.layer_ids:
            raise Eagle3Error(f"{path}: layer_ids {list(settings.layer_ids)} disagree with config.json's "
                              f"capture ids {list(draft.layer_ids)} (in our numbering)")
        draft.layer_ids = settings.layer_ids
    draft.speculation = {k: v for k, v in settings.to_dict().items() if k not in ("draft", "layer_ids")}
    return draft


def require_layer_ids(draft: CanonicalDraft, fmt: str) -> tuple:
    if draft.layer_ids is None:
        raise Eagle3Error(f"the {fmt} format records capture layer ids, but the source does not: pass --target "
                          f"(its default ids are used) or --layers")
    return draft.layer_ids
