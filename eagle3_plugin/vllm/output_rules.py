"""vLLM's per-request rules on the target's logits (penalties, ``min_tokens``, ``allowed_token_ids``, bad words,
``logit_bias``), as the core's :class:`~eagle3_plugin.output_rules.OutputRules`, and its ``min_p``.

vLLM keeps them in the input batch's ``SamplingMetadata``, row by row; ``min_tokens``, ``logit_bias`` and ``min_p``
in the batch's logits processors. A speculative vLLM builds only ``MinTokensLogitsProcessor`` and drops the other
two (with a warning at start-up); our runner builds vLLM's three built-in ones (:func:`builtin_logits_processors`),
so the steps vLLM's own sampler decides (a request's first token, steps that verify no tree) apply them as vLLM
without speculation does, and verification applies them from here.
"""

from __future__ import annotations

from typing import Optional

import torch
from vllm.v1.sample.logits_processor import BUILTIN_LOGITS_PROCESSORS, LogitsProcessors
from vllm.v1.sample.logits_processor.builtin import (LogitBiasLogitsProcessor, MinPLogitsProcessor,
                                                     MinTokensLogitsProcessor)

from ..output_rules import HeldBack, OutputRules


def builtin_logits_processors(vllm_config, device, is_pin_memory: bool) -> LogitsProcessors:
    """vLLM's built-in logits processors (``min_tokens``, ``logit_bias``, ``min_p``), as vLLM builds them without
    speculation."""
    return LogitsProcessors(ctor(vllm_config, device, is_pin_memory) for ctor in BUILTIN_LOGITS_PROCESSORS)


def output_rules(metadata, num_reqs: int, vocab_size: int) -> Optional[OutputRules]:
    """The rules of the batch's first ``num_reqs`` rows, or None if no row has any (the common case, checked
    without a loop over requests). vLLM lists the rows' output only when penalties or bad words read it."""
    held = _held_back(metadata, num_reqs)
    bias = _bias(metadata, num_reqs, vocab_size)
    if metadata.no_penalties and metadata.allowed_token_ids_mask is None and not metadata.bad_words_token_ids \
            and not held and bias is None:
        return None
    emitted = metadata.output_token_ids[:num_reqs] or [[] for _ in range(num_reqs)]
    rules = OutputRules(vocab_size, emitted, held_back=held, bias=bias,
                        bad_words={row: words for row, words in metadata.bad_words_token_ids.items() if row < num_reqs})
    if not metadata.no_penalties:
        rules.prompt = metadata.prompt_token_ids[:num_reqs].long()
        rules.presence = metadata.presence_penalties[:num_reqs].float()
        rules.frequency = metadata.frequency_penalties[:num_reqs].float()
        rules.repetition = metadata.repetition_penalties[:num_reqs].float()
    if metadata.allowed_token_ids_mask is not None:
        rules.banned = metadata.allowed_token_ids_mask[:num_reqs]
    return rules


def _held_back(metadata, num_reqs: int) -> dict[int, HeldBack]:
    """Rows whose ``min_tokens`` is not reached yet, from vLLM's ``MinTokensLogitsProcessor`` (row -> its minimum,
    its output list, its stop ids, whether it has structured output)."""
    held = {}
    processor = _processor(metadata.logitsprocs.non_argmax_invariant, MinTokensLogitsProcessor)
    for row, (minimum, output, stop_ids, structured) in (processor.min_toks.items() if processor else ()):
        if row < num_reqs and len(output) < minimum:
            held[row] = HeldBack(minimum - len(output), sorted(stop_ids), structured)
    return held


def _bias(metadata, num_reqs: int, vocab_size: int) -> Optional[torch.Tensor]:
    """``[num_reqs, V]`` from vLLM's ``LogitBiasLogitsProcessor`` (row -> {id: bias}), or None if no row has one."""
    processor = _processor(metadata.logitsprocs.non_argmax_invariant, LogitBiasLogitsProcessor)
    rows = {row: biases for row, biases in processor.biases.items() if row < num_reqs} if processor else {}
    if not rows:
        return None
    bias = torch.zeros(num_reqs, vocab_size)
    for row, biases in rows.items():
        bias[row, list(biases)] = torch.tensor(list(biases.values()), dtype=torch.float32)
    return bias


def min_p_of(metadata, num_reqs: int) -> Optional[torch.Tensor]:
    """``[num_reqs]`` from vLLM's ``MinPLogitsProcessor`` (0: off), or None if no row has one."""
    processor = _processor(metadata.logitsprocs.argmax_invariant, MinPLogitsProcessor)
    if processor is None or not processor.min_p_count:
        return None
    return torch.from_numpy(processor.min_p_cpu[:num_reqs].copy())


def _processor(processors, kind):
    """The batch's logits processor of class ``kind`` among ``processors``, or None."""
    return next((processor for processor in processors if isinstance(processor, kind)), None)
