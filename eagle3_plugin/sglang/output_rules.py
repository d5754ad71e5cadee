"""SGLang's penalties, ``min_new_tokens`` and ``logit_bias`` as the core's
:class:`~eagle3_plugin.output_rules.OutputRules` (SGLang's arithmetic, the bias last), applied at every tree node for
its own path.

Stock SGLang verifies a tree with every node penalised for the request's state before the step ("a relaxed
version", ``eagle_utils.py``), and counts one token per step. Here each node's context is the request's output
(its root, the last emitted token, included) then its path's draft tokens, as SGLang without speculation would
count them had it emitted that path. SGLang keeps its settings per request (``Req.sampling_params``); its
penalizers' running state is not read (it lags the tokens a speculative step emits).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..output_rules import HeldBack, OutputRules


def output_rules(batch, vocab_size: int) -> Optional[OutputRules]:
    """The rules of the batch's requests as of their roots (the output so far), or None if no request has any (the
    common case, told without a loop over requests: SGLang sums a batch's penalties into ``acc_additive_penalties``
    before each forward when any request has one, ``min_new_tokens`` included, and keeps a ``logit_bias`` when any
    request has one)."""
    info = batch.sampling_info
    if info.acc_additive_penalties is None and info.logit_bias is None:
        return None
    reqs, params = batch.reqs, [req.sampling_params for req in batch.reqs]
    outputs = [list(req.output_ids) for req in reqs]
    held = {row: HeldBack(p.min_new_tokens - len(out), _stop_ids(req))
            for row, (req, p, out) in enumerate(zip(reqs, params, outputs)) if len(out) < p.min_new_tokens}
    bias = None if info.logit_bias is None else info.logit_bias[:, :vocab_size].float()
    rules = OutputRules(vocab_size, outputs, held_back=held, bias=bias, arithmetic="sglang")
    if any(p.frequency_penalty != 0 or p.presence_penalty != 0 or p.repetition_penalty != 1 for p in params):
        rules.prompt = torch.empty(len(reqs), 0, dtype=torch.long)  # SGLang's repetition reads the output only
        rules.frequency, rules.presence, rules.repetition = (
            torch.tensor([getattr(p, name) for p in params], dtype=torch.float32)
            for name in ("frequency_penalty", "presence_penalty", "repetition_penalty"))
    return rules if (held or rules.has_penalties or bias is not None) else None


def check_roots(rules: OutputRules, roots: torch.Tensor) -> None:
    """Each request's output the ``rules`` read ends with its tree's root (``roots [B]``): SGLang has listed the last
    step's tokens. (It does so before the next step whenever its overlap scheduler is off, as it is on CPU with
    speculation.)"""
    last = [output[-1] if output else -1 for output in rules.emitted]
    if last != roots.tolist():
        raise RuntimeError("eagle3-plugin: a request's output does not end with its tree's root; its penalties "
                           "would read a stale output (SGLang's overlap scheduler on?)")


def _stop_ids(req) -> list[int]:
    """The ids SGLang's ``min_new_tokens`` penalizer holds back (``BatchedMinNewTokensPenalizer._prepare``)."""
    tokenizer = req.tokenizer
    ids = set(req.sampling_params.stop_token_ids or ()) | set(req.eos_token_ids or ())
    if tokenizer is not None:
        ids |= set(getattr(tokenizer, "additional_stop_token_ids", None) or ())
        if tokenizer.eos_token_id is not None:
            ids.add(tokenizer.eos_token_id)
    return sorted(i for i in ids if i is not None)
