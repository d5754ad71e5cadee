"""Turning data files into training examples: token ids plus a loss mask, responses regenerated on request."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..datafiles import Record, encode_prompt, read_training_data
from ..errors import Eagle3Error


DOCUMENT_OPENING = 64  # tokens of a text document kept as the prompt when responses are regenerated


@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is one the draft should learn to predict


def build_examples(paths: list[str], tokenizer, target, regenerate: bool, regen_tokens: int,
                   max_length: int, batch_size: int = 32) -> list[Example]:
    records: list[tuple[str, Record]] = [(p, r) for p in paths for r in read_training_data(p)]
    examples: list[Example] = []
    to_regenerate: list[list[int]] = []
    for path, record in records:
        if record.text is not None:
            ids = tokenizer(record.text, add_special_tokens=True)["input_ids"]
            if regenerate:  # the document's opening is the prompt; the target writes the rest
                to_regenerate.append(ids[:max(1, min(DOCUMENT_OPENING, len(ids) // 2))])
            else:
                examples.append(Example(ids, [1] * len(ids)))
            continue
        prompt = encode_prompt(tokenizer, record.prompt)
        if regenerate:
            to_regenerate.append(prompt)
        elif record.response is not None:
            response = tokenizer(record.response, add_special_tokens=False)["input_ids"]
            examples.append(Example(prompt + response, [0] * len(prompt) + [1] * len(response)))
        else:
            raise Eagle3Error(f"{path}: a record has a prompt but no response; add 'response' or pass --regenerate")
    if to_regenerate:
        for prompt, response in zip(to_regenerate, regenerate_responses(target, tokenizer, to_regenerate,
                                                                        regen_tokens, batch_size)):
            examples.append(Example(prompt + response, [0] * len(prompt) + [1] * len(response)))
    examples = [Example(e.input_ids[:max_length], e.loss_mask[:max_length]) for e in examples]
    examples = [e for e in examples if sum(e.loss_mask[2:]) > 0]
    if not examples:
        raise Eagle3Error("no training example has tokens to learn (all empty or too short)")
    return examples


@torch.inference_mode()
def regenerate_responses(target, tokenizer, prompts: list[list[int]], max_new_tokens: int,
                         batch_size: int) -> list[list[int]]:
    """The target's own greedy continuation of each prompt (the EAGLE-3 data practice)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = tokenizer.eos_token_id
    out = []
    for start in tqdm(range(0, len(prompts), batch_size), desc="regenerating responses", unit="batch"):
        batch = prompts[start:start + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        gen = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                              pad_token_id=pad, eos_token_id=eos)
        for row in gen[:, width:].tolist():
            out.append(row[: row.index(eos) + 1] if eos in row else row)
    return out


def draft_vocabulary(examples: list[Example], vocab_size: int,
                     draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t, t2d)`` from the frequencies of the tokens to learn: the most frequent, in id order.

    Ties (and tokens never seen, when fewer than ``draft_vocab_size`` occur) go to the lower id.
    """
    if not 1 <= draft_vocab_size <= vocab_size:
        raise Eagle3Error(f"--draft-vocab must be in [1, {vocab_size}], got {draft_vocab_size}")
    counts = Counter(t for e in examples for t, m in zip(e.input_ids, e.loss_mask) if m)
    freq = torch.zeros(vocab_size, dtype=torch.long)
    for token, n in counts.items():
        freq[token] = n
    order = sorted(range(vocab_size), key=lambda t: (-int(freq[t]), t))
    used = torch.tensor(sorted(order[:draft_vocab_size]), dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(draft_vocab_size), t2d
