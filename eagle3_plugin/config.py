"""``eagle3.json``: the one speculation config file, as a validated dataclass.

Example::

    {
      "draft": ".",                  # draft folder, relative to this file
      "layer_ids": [1, 3, 5],        # capture ids, our rule (eagle3_plugin.capture_ids); null = draft default
      "mode": "tree",                # "chain" or "tree"
      "depth": 5,                    # draft levels: the most draft tokens one round can accept
      "top_k": 8,                    # children per expanded node (chain: 1)
      "total_tokens": 32,            # tokens verified per round, root included (chain: depth + 1)
      "tree_sampler": "real",        # T>0 verification: "real" draft probabilities or "one_hot" (EAGLE/SGLang)
      "budget": "auto"               # "auto": per step, the tree shape the load pays for (tree, chain or none);
                                     # "fixed": always the tree above
    }

EAGLE's ``topK_genrate(depth=d, top_k=k, total_token=t)`` is ``depth=d+1, top_k=k, total_tokens=t+1``;
SGLang's ``--speculative-num-steps S --speculative-eagle-topk K --speculative-num-draft-tokens N`` is
``depth=S, top_k=K, total_tokens=N``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Literal, Optional

from .errors import Eagle3Error
from .fsutil import read_json_object

MODES = ("chain", "tree")
TREE_SAMPLERS = ("real", "one_hot")
BUDGETS = ("auto", "fixed")
CONFIG_FILENAME = "eagle3.json"


@dataclass(frozen=True)
class Eagle3Config:
    draft: str = "."
    layer_ids: Optional[tuple[int, int, int]] = None
    mode: Literal["chain", "tree"] = "tree"
    depth: int = 5
    top_k: int = 8
    total_tokens: int = 32
    tree_sampler: Literal["real", "one_hot"] = "real"
    budget: Literal["auto", "fixed"] = "auto"

    def __post_init__(self):
        _check(isinstance(self.draft, str) and self.draft, "draft", "a non-empty path string", self.draft)
        if self.layer_ids is not None:
            ok = isinstance(self.layer_ids, (list, tuple)) and len(self.layer_ids) == 3 and all(
                _is_int(i) and i >= 0 for i in self.layer_ids)
            _check(ok and len(set(self.layer_ids)) == 3 and list(self.layer_ids) == sorted(self.layer_ids),
                   "layer_ids", "three distinct increasing non-negative integers or null", self.layer_ids)
            object.__setattr__(self, "layer_ids", tuple(self.layer_ids))
        _check(self.mode in MODES, "mode", f"one of {MODES}", self.mode)
        _check(self.tree_sampler in TREE_SAMPLERS, "tree_sampler", f"one of {TREE_SAMPLERS}", self.tree_sampler)
        _check(self.budget in BUDGETS, "budget", f"one of {BUDGETS}", self.budget)
        for key in ("depth", "top_k", "total_tokens"):
            value = getattr(self, key)
            _check(_is_int(value) and value >= 1, key, "a positive integer", value)
        if self.mode == "chain":
            _check(self.top_k == 1, "top_k", "1 in chain mode", self.top_k)
            _check(self.total_tokens == self.depth + 1, "total_tokens", "depth + 1 in chain mode",
                   self.total_tokens)
        most = 1 + self.top_k + (self.depth - 1) * self.top_k * self.top_k
        _check(self.depth + 1 <= self.total_tokens <= most, "total_tokens",
               f"between depth + 1 = {self.depth + 1} and the tree's candidate count "
               f"1 + top_k + (depth - 1) * top_k^2 = {most}", self.total_tokens)

    @classmethod
    def chain(cls, depth: int, **kw) -> "Eagle3Config":
        return cls(mode="chain", depth=depth, top_k=1, total_tokens=depth + 1, **kw)

    @classmethod
    def from_dict(cls, data: dict, source: str = "config") -> "Eagle3Config":
        if not isinstance(data, dict):
            raise Eagle3Error(f"{source}: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise Eagle3Error(f"{source}: unknown key {unknown[0]!r} (known keys: {', '.join(sorted(known))})")
        data = dict(data)
        if data.get("mode") == "chain":
            data.setdefault("top_k", 1)
            if "depth" in data:
                data.setdefault("total_tokens", data["depth"] + 1)
        try:
            return cls(**data)
        except Eagle3Error as e:
            raise Eagle3Error(f"{source}: {e}") from None

    @classmethod
    def load(cls, path: str) -> "Eagle3Config":
        """Read ``path`` (a file, or a folder holding ``eagle3.json``); ``draft`` becomes absolute."""
        if os.path.isdir(path):
            path = os.path.join(path, CONFIG_FILENAME)
        config = cls.from_dict(read_json_object(path, "config file"), source=path)
        draft = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), config.draft))
        return dataclasses.replace(config, draft=draft)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["layer_ids"] = list(self.layer_ids) if self.layer_ids is not None else None
        return d

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, key: str, expected: str, value) -> None:
    if not ok:
        raise Eagle3Error(f"{key!r} must be {expected}, got {value!r}")
