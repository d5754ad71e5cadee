"""``eagle3 convert`` and ``eagle3 inspect``: any draft format to any other, validated, written atomically."""

from __future__ import annotations

import os
import sys

import torch
from tqdm import tqdm

from .capture_ids import CONVENTIONS, default_layer_ids, from_ours
from .errors import Eagle3Error
from .fsutil import atomic_directory
from .weights import all_finite


def _target_config(target: str | None):
    if target is None:
        return None
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(target)
    except (OSError, ValueError) as e:
        raise Eagle3Error(f"{target}: cannot read the target config ({e})") from None


def load_source(src: str, target: str | None = None, layers=None):
    from .adapters import detect, read
    fmt = detect(src)
    draft = read(src)
    target_config = _target_config(target)
    if layers is not None:
        draft.layer_ids = tuple(layers)
    elif draft.layer_ids is None and target_config is not None:
        draft.layer_ids = default_layer_ids(target_config.num_hidden_layers)
    return fmt, draft, target_config


def convert(src: str, to: str, out: str, target: str | None = None, layers=None, force: bool = False,
            shard_bytes: int | None = None) -> str:
    from .adapters import WRITERS
    if to not in WRITERS:
        raise Eagle3Error(f"unknown output format {to!r}; choose one of {', '.join(WRITERS)}")
    source, output = os.path.realpath(src), os.path.realpath(out)
    if os.path.commonpath([source, output]) == output:
        raise Eagle3Error(f"{out}: the output would replace the source {src} (or a folder holding it); "
                          "choose another --out")
    fmt, draft, target_config = load_source(src, target, layers)
    problems = draft.problems(target_config)
    if problems:
        raise Eagle3Error(f"{src} ({fmt} format): " + "; ".join(problems))
    total = sum(t.nbytes for t in draft.tensors.values())
    try:
        with atomic_directory(out, force=force) as tmp, tqdm(total=total, unit="B", unit_scale=True,
                                                            file=sys.stderr, desc=f"{fmt} -> {to}") as bar:
            WRITERS[to](draft, tmp, progress=bar.update, shard_bytes=shard_bytes)
    except OSError as e:
        raise Eagle3Error(f"{out}: writing failed ({e}); nothing was written") from None
    return fmt


def inspect_report(folder: str, target: str | None = None, layers=None) -> dict:
    fmt, draft, target_config = load_source(folder, target, layers)
    problems = draft.problems(target_config)
    for name, t in draft.tensors.items():
        if t.dtype.is_floating_point and not all_finite(t.load()):
            problems.append(f"tensor {name!r} contains NaN or Inf")
    c = draft.config
    report = {"folder": folder, "format": fmt, "config": c.to_json_dict(),
              "tensors": {k: [list(t.shape), str(t.dtype).replace("torch.", "")] for k, t in draft.tensors.items()},
              "embed_tokens": draft.embed_tokens is not None,
              "vocab": {"vocab_size": c.vocab_size, "draft_vocab_size": c.draft_vocab_size,
                        "full": c.vocab_size == c.draft_vocab_size},
              "capture_layers": None if draft.layer_ids is None else
              {conv: list(from_ours(draft.layer_ids, conv)) for conv in CONVENTIONS},
              "problems": problems}
    if "d2t" in draft.tensors and not any("d2t" in p for p in problems):
        hot = draft.tensors["d2t"].load() + torch.arange(c.draft_vocab_size)
        report["vocab"].update(first_target_id=int(hot[0]), last_target_id=int(hot[-1]))
    return report


def format_report(report: dict) -> str:
    lines = [f"{report['folder']}: {report['format']} format",
             f"  hidden {report['config']['hidden_size']}, target hidden {report['config']['target_hidden_size']}, "
             f"vocab {report['vocab']['vocab_size']}, draft vocab {report['vocab']['draft_vocab_size']}"
             + (" (full)" if report["vocab"]["full"] else ""),
             "  capture layers: " + ("not recorded (pass --target for its default)" if report["capture_layers"] is None
                                     else ", ".join(f"{k} {v}" for k, v in report["capture_layers"].items())),
             f"  embed_tokens: {'present' if report['embed_tokens'] else 'absent (shared from the target)'}",
             "  tensors:"]
    lines += [f"    {name}: {shape} {dtype}" for name, (shape, dtype) in report["tensors"].items()]
    lines += ["  problems:" if report["problems"] else "  no problems found"]
    lines += [f"    - {p}" for p in report["problems"]]
    return "\n".join(lines)
