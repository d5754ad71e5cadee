"""``eagle3 train``: fit an EAGLE-3 draft to a transformers target with training-time test.

Resumable: progress is saved to ``<out>.partial/`` every ``save_every`` steps and when the time budget
runs out; running the same command again continues from there. The finished draft (official layout,
safetensors, plus ``eagle3.json``) appears at ``--out`` in one rename.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from typing import Optional

import torch
from tqdm import tqdm

from ..capture import FusedCapture
from ..capture_ids import LayerIdError, default_layer_ids, validate_layer_ids
from ..checkpoint import save_draft
from ..config import Eagle3Config
from ..draft import DraftConfig, Eagle3Draft
from ..errors import Eagle3Error
from .data import Example, build_examples, draft_vocabulary
from .ttt import ttt_loss


@dataclass
class TrainArgs:
    target: str
    data: list
    out: str
    layers: Optional[tuple] = None
    ttt_steps: int = 7
    draft_vocab: Optional[int] = None
    max_steps: Optional[int] = None  # None: 2000, or without a step limit when max_minutes is given
    max_minutes: Optional[float] = None
    seed: int = 0
    lr: float = 3e-3
    batch_size: int = 8
    max_length: int = 384
    regenerate: bool = False
    regen_tokens: int = 128
    save_every: int = 100
    force: bool = False

    def fingerprint(self) -> dict:
        """The arguments that must match for a resume (not the budget or output options)."""
        d = dataclasses.asdict(self)
        for k in ("max_minutes", "save_every", "force", "max_steps"):
            d.pop(k)
        d["layers"] = list(d["layers"]) if d["layers"] else None
        return d


def train(args: TrainArgs) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    state_dir = args.out.rstrip("/") + ".partial"
    resuming = _same_run(state_dir, args)
    if os.path.exists(args.out) and not (args.force or resuming):
        raise Eagle3Error(f"{args.out}: output folder already exists (use --force to replace it)")
    if args.ttt_steps < 1:
        raise Eagle3Error(f"--ttt-steps must be >= 1, got {args.ttt_steps}")
    torch.manual_seed(args.seed)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    target.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    try:
        layer_ids = validate_layer_ids(args.layers, target.config.num_hidden_layers) if args.layers else \
            default_layer_ids(target.config.num_hidden_layers)
    except LayerIdError as e:
        raise Eagle3Error(f"--layers: {e}") from None

    if not resuming:
        shutil.rmtree(state_dir, ignore_errors=True)
        examples = build_examples(args.data, tokenizer, target, args.regenerate, args.regen_tokens, args.max_length)
        os.makedirs(state_dir)
        _write_json(os.path.join(state_dir, "examples.json"), [dataclasses.astuple(e) for e in examples])
        _write_json(os.path.join(state_dir, "args.json"), args.fingerprint())
    with open(os.path.join(state_dir, "examples.json")) as f:
        examples = [Example(*e) for e in json.load(f)]
    state_path = os.path.join(state_dir, "state.pt")
    state = torch.load(state_path, weights_only=True) if os.path.exists(state_path) else None

    vocab = target.config.vocab_size
    draft_vocab = args.draft_vocab or vocab
    draft = Eagle3Draft(DraftConfig.for_target(target.config, draft_vocab))
    d2t, t2d = draft_vocabulary(examples, vocab, draft_vocab)
    draft.d2t.copy_(d2t)
    draft.t2d.copy_(t2d)
    _init_from_target(draft, target)
    draft.attach_embedding(target.get_input_embeddings())
    optimizer = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, loss, acc = 0, None, None
    rng = random.Random(args.seed)
    if state is not None:
        draft.load_state_dict(state["draft"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        rng.setstate(_as_tuples(state["rng"]))
        print(f"resuming from step {step} ({state_dir})")

    capture = FusedCapture(target, layer_ids)
    budget = Budget(args.max_steps, args.max_minutes, elapsed=state.get("elapsed", 0.0) if state else 0.0)
    bar = tqdm(total=budget.max_steps, initial=step, desc="training draft", unit="step")
    while not budget.over(step):
        for group in optimizer.param_groups:
            group["lr"] = _lr(step, budget.progress(step), args.lr)
        batch = [examples[rng.randrange(len(examples))] for _ in range(args.batch_size)]
        ids, mask = _pad(batch)
        with torch.no_grad(), capture:
            logits = target(input_ids=ids).logits
            features = capture.features.clone()
        loss, acc = ttt_loss(draft, ids, features, logits, mask, args.ttt_steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", acc0=f"{acc[0]:.2f}", acc_last=f"{acc[-1]:.2f}")
        if step % args.save_every == 0:
            _save_state(state_dir, draft, optimizer, step, rng, budget.elapsed())
    bar.close()
    finished = budget.finished(step)
    if not finished:
        _save_state(state_dir, draft, optimizer, step, rng, budget.elapsed())
        print(f"time budget reached at step {step}/{budget.max_steps}; run the same command to resume")
    config = Eagle3Config(layer_ids=layer_ids)
    report = {"steps": step, "max_steps": budget.max_steps, "minutes": budget.elapsed() / 60,
              "args": args.fingerprint(), "final_loss": None if loss is None else loss.item(),
              "final_step_accuracy": acc}
    save_draft(draft, args.out, config, force=True, extra_json={"training.json": report})
    if finished:
        shutil.rmtree(state_dir, ignore_errors=True)
    return args.out


def _init_from_target(draft: Eagle3Draft, target) -> None:
    """Warm start: the draft's LM head from the target's rows for the draft vocabulary."""
    head = target.get_output_embeddings().weight
    with torch.no_grad():
        draft.lm_head.weight.copy_(head[draft.hot_token_ids])


class Budget:
    """When training stops and how far along the schedule it is. With ``max_steps`` (default 2000 when no time is
    given) the cosine schedule runs over the steps and ``max_minutes`` only interrupts (resumably, a fresh budget
    per run); with ``max_minutes`` alone the schedule spans the minutes, counted over resumed runs too."""

    def __init__(self, max_steps: Optional[int], max_minutes: Optional[float], elapsed: float = 0.0):
        self.by_time = max_steps is None and max_minutes is not None
        self.max_steps = None if self.by_time else (max_steps if max_steps is not None else DEFAULT_STEPS)
        self.seconds = 60 * max_minutes if max_minutes else math.inf
        self._began = time.monotonic() - (elapsed if self.by_time else 0.0)

    def elapsed(self) -> float:
        return time.monotonic() - self._began

    def progress(self, step: int) -> float:
        return self.elapsed() / self.seconds if self.by_time else step / max(1, self.max_steps)

    def finished(self, step: int) -> bool:
        return self.elapsed() >= self.seconds if self.by_time else step >= self.max_steps

    def over(self, step: int) -> bool:
        return self.finished(step) or self.elapsed() >= self.seconds


DEFAULT_STEPS = 2000


def _lr(step: int, progress: float, peak: float, warmup: int = 50) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from ``peak`` to a tenth of it as ``progress`` goes 0 -> 1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def _pad(batch: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(e.input_ids) for e in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for row, e in enumerate(batch):
        ids[row, :len(e.input_ids)] = torch.tensor(e.input_ids)
        mask[row, :len(e.loss_mask)] = torch.tensor(e.loss_mask)
    return ids, mask


def _save_state(state_dir: str, draft, optimizer, step: int, rng: random.Random, elapsed: float) -> None:
    tmp = os.path.join(state_dir, "state.pt.tmp")
    torch.save({"draft": draft.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "rng": rng.getstate(), "elapsed": elapsed}, tmp)
    os.replace(tmp, os.path.join(state_dir, "state.pt"))


def _same_run(state_dir: str, args: TrainArgs) -> bool:
    """Whether ``state_dir`` holds prepared data (and maybe progress) of a run with the same arguments."""
    try:
        with open(os.path.join(state_dir, "args.json")) as f:
            same = json.load(f) == json.loads(json.dumps(args.fingerprint()))
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return same and os.path.exists(os.path.join(state_dir, "examples.json"))


def _write_json(path: str, data) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def _as_tuples(x):
    return tuple(_as_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x
