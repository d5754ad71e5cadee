"""Readers for prompt and training files; every malformed record is one error naming file and line.

Records are :class:`Record`: a ``prompt`` (first user turn) and any ``later_turns``, an optional ``response``
(a reference answer to train on), an optional whole ``text`` (a document to train on), and a ``category``.

Formats, by extension and content:

- ``.jsonl``: one JSON object per line with ``turns`` (FastChat / MT-Bench / Spec-Bench / EAGLE
  question files), ``prompt`` (+ optional ``response``; HumanEval), ``question`` (GSM8K),
  ``instruction`` (Alpaca), or ``text``; optional ``category``.
- ``.txt`` as prompts: one prompt per non-empty line. ``.txt`` as training data: documents separated
  by blank lines.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Iterator, Optional

from .errors import Eagle3Error

PROMPT_FIELDS = ("turns", "prompt", "question", "instruction", "text")


@dataclass(frozen=True)
class Record:
    prompt: str = ""
    response: Optional[str] = None
    text: Optional[str] = None
    category: Optional[str] = None
    later_turns: tuple = ()

    @property
    def turns(self) -> tuple:
        """Every user turn, first to last."""
        return (self.prompt, *self.later_turns)


def iter_jsonl(path: str) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line; bad JSON or a non-object is an error."""
    with _open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise Eagle3Error(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise Eagle3Error(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def read_prompts(path: str) -> list[Record]:
    """Prompt records for benchmarks (multi-turn questions keep their later turns)."""
    with _utf8(path):
        return _read_prompts(path)


def read_training_data(path: str) -> list[Record]:
    """Training records: ``.txt`` documents split at blank lines, or ``.jsonl`` records."""
    with _utf8(path):
        return _read_training_data(path)


PLAIN_TURN_SEPARATOR = "\n\n"


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """The prompt as the target sees it: its chat template when it has one, else plain text with BOS."""
    return encode_conversation(tokenizer, (prompt,), ())


def encode_conversation(tokenizer, turns, answers, chat_template: bool = True) -> list[int]:
    """User ``turns`` with the ``answers`` given to all but the last, asking the last: the tokenizer's chat template
    when it has one (and ``chat_template``), else plain text with BOS, turns and answers joined by blank lines."""
    if len(turns) != len(answers) + 1:
        raise ValueError(f"{len(turns)} turns need {len(turns) - 1} answers, got {len(answers)}")
    if chat_template and getattr(tokenizer, "chat_template", None):
        messages = [{"role": role, "content": text} for turn, answer in zip(turns, (*answers, None))
                    for role, text in (("user", turn), ("assistant", answer)) if text is not None]
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
    parts = [text for turn, answer in zip(turns, (*answers, None)) for text in (turn, answer) if text is not None]
    return tokenizer(PLAIN_TURN_SEPARATOR.join(parts), add_special_tokens=True)["input_ids"]


def _read_prompts(path: str) -> list[Record]:
    if path.endswith(".jsonl"):
        records = [_record(path, lineno, obj) for lineno, obj in iter_jsonl(path)]
    else:
        with _open(path) as f:
            records = [Record(prompt=line.rstrip("\n")) for line in f if line.strip()]
    if not records:
        raise Eagle3Error(f"{path}: no prompts found")
    return records


def _read_training_data(path: str) -> list[Record]:
    if path.endswith(".jsonl"):
        records = [_record(path, lineno, obj) for lineno, obj in iter_jsonl(path)]
    else:
        with _open(path) as f:
            docs = [d.strip("\n") for d in f.read().split("\n\n")]
        records = [Record(text=d) for d in docs if d.strip()]
    if not records:
        raise Eagle3Error(f"{path}: no training records found")
    return records


def _record(path: str, lineno: int, obj: dict) -> Record:
    where = f"{path}:{lineno}"
    category = obj.get("category")
    if category is not None and not isinstance(category, str):
        raise Eagle3Error(f"{where}: 'category' must be a string")
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise Eagle3Error(f"{where}: 'turns' must be a non-empty list of strings")
        return Record(prompt=turns[0], category=category, later_turns=tuple(turns[1:]))
    for key in ("prompt", "question", "instruction"):
        if key in obj:
            prompt = _string(obj, key, where)
            response = _string(obj, "response", where) if "response" in obj else None
            return Record(prompt=prompt, response=response, category=category)
    if "text" in obj:
        return Record(text=_string(obj, "text", where), category=category)
    raise Eagle3Error(f"{where}: no prompt field (expected one of {', '.join(PROMPT_FIELDS)})")


def _string(obj: dict, key: str, where: str) -> str:
    value = obj[key]
    if not isinstance(value, str) or not value.strip():
        raise Eagle3Error(f"{where}: {key!r} must be a non-empty string")
    return value


@contextlib.contextmanager
def _utf8(path: str):
    try:
        yield
    except UnicodeDecodeError as e:
        raise Eagle3Error(f"{path}: not UTF-8 text (byte {e.start})") from None


def _open(path: str):
    try:
        return open(path, encoding="utf-8")
    except FileNotFoundError:
        raise Eagle3Error(f"{path}: no such file") from None
    except IsADirectoryError:
        raise Eagle3Error(f"{path}: is a directory, expected a file") from None
