#!/usr/bin/env python
"""Build the small reference *target* model used by tests and demos.

The target is a 6-layer Llama (~1.4M parameters) with a 2048-token byte-level
BPE vocabulary, trained from scratch on the Python standard library sources of
the running interpreter. The script is deterministic for a given interpreter,
seed and number of steps run (``--max-minutes`` can cut training short on a
slow machine; ``build_info.json`` records how many steps were run).

Outputs:
  <out>/                 model (bfloat16 safetensors), tokenizer, build_info.json
  <prompts-dir>/heldout.jsonl        48 prompts from held-out files (benchmarks, tests)
  <prompts-dir>/train_prompts.jsonl  2000 prompts from train files (draft training)

Usage:
  python ci/build_target.py [--out DIR] [--prompts-dir DIR]
                            [--max-steps N] [--max-minutes M] [--seed S]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import platform
import random
import shutil
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tqdm import tqdm
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

REPO_ROOT = Path(__file__).resolve().parent.parent

# Corpus.
EXCLUDED_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages"})
MAX_FILE_BYTES = 200_000
HELDOUT_MODULUS = 20  # a file is held out when sha1(relpath) % 20 == 0 (~5%)

# Tokenizer.
VOCAB_SIZE = 2048
BOS, EOS, PAD = "<s>", "</s>", "<pad>"  # ids 0, 1, 2

# Training.
SEQ_LEN = 256
BATCH_SIZE = 16
LR = 3e-3
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
WARMUP_STEPS = 50
MIN_LR_RATIO = 0.1
GRAD_CLIP = 1.0
EVAL_SEQUENCES = 64
NUM_THREADS = 2

# Prompts.
NUM_HELDOUT_PROMPTS = 48
NUM_TRAIN_PROMPTS = 2000
PROMPT_EXTRA_LINES = (3, 6)
PROMPT_CHARS = (80, 600)


@dataclass(frozen=True)
class Document:
    """One source file of the corpus."""

    relpath: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """The stdlib sources, split into train and held-out files."""

    train: list[Document]
    heldout: list[Document]


# --------------------------------------------------------------------------- corpus


def is_heldout(relpath: str) -> bool:
    """Deterministic ~5% held-out split keyed on the file's relative path."""
    return int(hashlib.sha1(relpath.encode()).hexdigest(), 16) % HELDOUT_MODULUS == 0


def load_corpus() -> Corpus:
    """Read the interpreter's stdlib ``*.py`` files, sorted by relative path, and split them."""
    root = Path(sysconfig.get_paths()["stdlib"])
    train, heldout = [], []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root)
        if EXCLUDED_DIRS.intersection(rel.parts[:-1]) or path.stat().st_size > MAX_FILE_BYTES:
            continue
        doc = Document(rel.as_posix(), path.read_text(encoding="utf-8"))
        (heldout if is_heldout(doc.relpath) else train).append(doc)
    return Corpus(train, heldout)


# --------------------------------------------------------------------------- prompts


def candidate_prompts(text: str, rng: random.Random) -> list[str]:
    """All prompts of one file, in random order.

    A prompt starts at a top-level ``def``/``class`` line and runs through the next
    3 to 6 lines. It ends without a newline, so the model's first generated token
    is the natural continuation (newline plus indentation) of the last line.
    """
    lines = text.splitlines()
    prompts = []
    for i, line in enumerate(lines):
        if line.startswith(("def ", "class ")):
            prompt = "\n".join(lines[i : i + 1 + rng.randint(*PROMPT_EXTRA_LINES)])
            if PROMPT_CHARS[0] <= len(prompt) <= PROMPT_CHARS[1]:
                prompts.append(prompt)
    rng.shuffle(prompts)
    return prompts


def sample_prompts(docs: list[Document], count: int, seed: str) -> list[str]:
    """Pick ``count`` distinct prompts, round-robin over files so that they vary."""
    rng = random.Random(seed)
    pools = [candidate_prompts(doc.text, rng) for doc in docs]
    rng.shuffle(pools)
    prompts: dict[str, None] = {}  # insertion-ordered set
    for prompt in itertools.chain.from_iterable(itertools.zip_longest(*pools)):
        if prompt is not None:
            prompts[prompt] = None
            if len(prompts) == count:
                return list(prompts)
    raise RuntimeError(f"only {len(prompts)} prompts available, {count} requested")


def write_jsonl(path: Path, prompts: list[str]) -> None:
    """Write ``{"prompt": ...}`` lines atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for prompt in prompts:
            f.write(json.dumps({"prompt": prompt}) + "\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(docs: list[Document]) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``docs`` and wrap it for ``transformers``.

    Like Llama's tokenizer, it prepends ``<s>`` when called with the default
    ``add_special_tokens=True``.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((doc.text for doc in docs), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, 0)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tok: PreTrainedTokenizerFast, outdir: Path) -> None:
    """Save ``tok``, recording the class name that transformers 4.x also understands.

    transformers 5 writes its internal name ``TokenizersBackend``, which older
    versions (as pinned by inference engines) cannot resolve.
    """
    tok.save_pretrained(outdir)
    config_path = outdir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def check_tokenizer(outdir: Path, sample: str) -> None:
    """Reload the saved tokenizer with ``AutoTokenizer`` and check ids and round-trip."""
    tok = AutoTokenizer.from_pretrained(outdir)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)
    assert len(tok) == VOCAB_SIZE, len(tok)
    ids = tok(sample)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == sample, "tokenizer does not round-trip"


# --------------------------------------------------------------------------- data


def to_sequences(tok: PreTrainedTokenizerFast, docs: list[Document]) -> torch.Tensor:
    """Encode each document as ``<s> tokens </s>``, concatenate, cut into SEQ_LEN rows."""
    encoded = tok.backend_tokenizer.encode_batch([doc.text for doc in docs], add_special_tokens=False)
    stream = [i for enc in encoded for i in (tok.bos_token_id, *enc.ids, tok.eos_token_id)]
    n = len(stream) // SEQ_LEN
    return torch.tensor(stream[: n * SEQ_LEN], dtype=torch.long).view(n, SEQ_LEN)


def batches(seqs: torch.Tensor, generator: torch.Generator):
    """Endless stream of batches: one seeded permutation per epoch, last partial batch dropped."""
    while True:
        order = torch.randperm(len(seqs), generator=generator)
        for start in range(0, len(seqs) - BATCH_SIZE + 1, BATCH_SIZE):
            yield seqs[order[start : start + BATCH_SIZE]]


def eval_subset(seqs: torch.Tensor) -> torch.Tensor:
    """Up to EVAL_SEQUENCES rows, evenly spaced so they cover many files."""
    if len(seqs) <= EVAL_SEQUENCES:
        return seqs
    return seqs[torch.linspace(0, len(seqs) - 1, EVAL_SEQUENCES).long()]


# --------------------------------------------------------------------------- model


def build_model(seed: int) -> LlamaForCausalLM:
    """Freshly initialised fp32 target model."""
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # vLLM's CPU attention needs head_dim >= 32
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def make_optimizer(model: torch.nn.Module, max_steps: int):
    """AdamW (no decay on norm weights) with linear warm-up and cosine decay to MIN_LR_RATIO."""
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS)

    def lr_factor(step: int) -> float:
        if step < WARMUP_STEPS:
            return (step + 1) / WARMUP_STEPS
        progress = min(1.0, (step - WARMUP_STEPS) / max(1, max_steps - WARMUP_STEPS))
        return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)


def train(model: LlamaForCausalLM, seqs: torch.Tensor, args: argparse.Namespace) -> tuple[int, float]:
    """Train until ``max_steps`` or ``max_minutes``; return (steps run, minutes)."""
    optimizer, scheduler = make_optimizer(model, args.max_steps)
    data = batches(seqs, torch.Generator().manual_seed(args.seed))
    deadline = time.monotonic() + 60 * args.max_minutes if args.max_minutes else math.inf
    limit = args.stop_at_step or args.max_steps
    start = time.monotonic()
    model.train()
    steps = 0
    with tqdm(total=limit, desc="train", file=sys.stderr) as bar:
        while steps < limit and time.monotonic() < deadline:
            batch = next(data)
            loss = model(input_ids=batch, labels=batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            optimizer.step()
            scheduler.step()
            steps += 1
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
    return steps, (time.monotonic() - start) / 60


@torch.no_grad()
def mean_loss(model: LlamaForCausalLM, seqs: torch.Tensor) -> float:
    """Mean next-token loss over ``seqs`` (all rows have the same length)."""
    model.eval()
    total = sum(model(input_ids=b, labels=b).loss.item() * len(b) for b in seqs.split(BATCH_SIZE))
    return total / len(seqs)


# --------------------------------------------------------------------------- output


def replace_dir(src: Path, dst: Path) -> None:
    """Move the finished ``src`` over ``dst``, removing an older ``dst`` only afterwards."""
    old = dst.with_name(f".{dst.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if dst.exists():
        dst.rename(old)
    src.rename(dst)
    shutil.rmtree(old, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "checkpoints" / "target")
    parser.add_argument("--prompts-dir", type=Path, default=REPO_ROOT / "checkpoints" / "prompts")
    parser.add_argument("--max-steps", type=int, default=1500, help="also the cosine schedule length")
    parser.add_argument("--max-minutes", type=float, default=15.0, help="training time budget (0: none)")
    parser.add_argument("--stop-at-step", type=int, help="stop after this many steps (the schedule keeps --max-steps)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def build(outdir: Path, corpus: Corpus, args: argparse.Namespace) -> None:
    """Train tokenizer and model on ``corpus`` and save everything into ``outdir``."""
    tok = train_tokenizer(corpus.train)
    save_tokenizer(tok, outdir)

    train_seqs = to_sequences(tok, corpus.train)
    heldout_seqs = to_sequences(tok, corpus.heldout)
    print(
        f"{len(train_seqs)} train / {len(heldout_seqs)} held-out sequences of {SEQ_LEN} tokens",
        file=sys.stderr,
    )

    model = build_model(args.seed)
    steps, minutes = train(model, train_seqs, args)
    train_loss = mean_loss(model, eval_subset(train_seqs))
    heldout_loss = mean_loss(model, eval_subset(heldout_seqs))
    print(
        f"steps {steps} in {minutes:.1f} min: train loss {train_loss:.4f}, held-out loss {heldout_loss:.4f}"
    )

    model.to(torch.bfloat16).save_pretrained(outdir)  # safetensors
    info = {
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "num_train_files": len(corpus.train),
        "num_heldout_files": len(corpus.heldout),
        "num_train_sequences": len(train_seqs),
        "num_heldout_sequences": len(heldout_seqs),
        "steps": steps,
        "minutes": round(minutes, 2),
        "train_loss": round(train_loss, 4),
        "heldout_loss": round(heldout_loss, 4),
        "seed": args.seed,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    (outdir / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    check_tokenizer(outdir, corpus.heldout[0].text)  # as users load it, next to config.json


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(NUM_THREADS)

    corpus = load_corpus()
    print(
        f"python {platform.python_version()}: {len(corpus.train)} train files, "
        f"{len(corpus.heldout)} held-out files",
        file=sys.stderr,
    )
    heldout_prompts = sample_prompts(corpus.heldout, NUM_HELDOUT_PROMPTS, seed="heldout")
    train_prompts = sample_prompts(corpus.train, NUM_TRAIN_PROMPTS, seed="train")

    tmp = args.out.with_name(f".{args.out.name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True)
    try:
        build(tmp, corpus, args)
        replace_dir(tmp, args.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    write_jsonl(args.prompts_dir / "heldout.jsonl", heldout_prompts)
    write_jsonl(args.prompts_dir / "train_prompts.jsonl", train_prompts)
    print(f"wrote {args.out} and {args.prompts_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
