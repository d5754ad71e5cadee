"""vLLM's per-request rules on the target's logits that read the request's output (penalties, ``min_tokens``,
``allowed_token_ids``, bad words), as the core's :class:`~eagle3_plugin.output_rules.OutputRules`.

vLLM keeps them in the input batch's ``SamplingMetadata`` (its ``min_tokens`` in the batch's
``MinTokensLogitsProcessor``, the one logits processor it builds for a speculative engine), row by row.
"""

from __future__ import annotations

from typing import Optional

from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor

from ..output_rules import HeldBack, OutputRules


def output_rules(metadata, num_reqs: int, vocab_size: int) -> Optional[OutputRules]:
    """The rules of the batch's first ``num_reqs`` rows, or None if no row has any (the common case, checked
    without a loop over requests). vLLM lists the rows' output only when penalties or bad words read it."""
    held = _held_back(metadata, num_reqs)
    if metadata.no_penalties and metadata.allowed_token_ids_mask is None and not metadata.bad_words_token_ids \
            and not held:
        return None
    emitted = metadata.output_token_ids[:num_reqs] or [[] for _ in range(num_reqs)]
    rules = OutputRules(vocab_size, emitted, held_back=held,
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
    for processor in metadata.logitsprocs.non_argmax_invariant:
        if isinstance(processor, MinTokensLogitsProcessor):
            for row, (minimum, output, stop_ids, structured) in processor.min_toks.items():
                if row < num_reqs and len(output) < minimum:
                    held[row] = HeldBack(minimum - len(output), sorted(stop_ids), structured)
    return held
