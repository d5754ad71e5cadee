"""A seeded request's first token, drawn from the request's own generator.

SGLang draws a prompt's first token in its prefill sampler from one generator shared by every request (it reads
``sampling_seed`` only with ``--enable-deterministic-inference``); our worker draws every later token from the
request's own generator. So that a seeded request repeats whatever else is in the batch, the worker's prefill marks
the batch's sampling info with its seeded rows (:func:`drawing_seeded_rows`) and a hook on SGLang's sampler redraws
them from the probabilities it drew from (penalties, logit bias, grammar mask and temperature applied), with the
request's top-k, top-p and min-p. SGLang's logprobs then read our tokens, as they read its own.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..rng import RowRandom
from ..sampler import SamplingParams, sample_tokens

ATTRIBUTE = "eagle3_seeded_rows"


@dataclass
class SeededRows:
    """``rows [S]``: the batch rows to redraw; ``params`` and ``random`` (row ``i``: ``rows[i]``'s generator): theirs,
    with temperature 1 (SGLang's probabilities are tempered already)."""

    rows: torch.Tensor
    params: SamplingParams
    random: RowRandom

    def redraw(self, tokens: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """``tokens [B]`` with the rows' tokens drawn from their ``probs [S, V]``."""
        tokens = tokens.clone()
        tokens[self.rows] = sample_tokens(probs.log(), self.params, self.random).to(tokens.dtype)
        return tokens


@contextlib.contextmanager
def drawing_seeded_rows(batch, params: SamplingParams, random: RowRandom):
    """While SGLang samples ``batch``'s first tokens: its sampled rows with a generator of their own (in ``random``,
    by row, none for a prompt chunk) drawn from it. A greedy row needs no draw."""
    rows = random.seeded_rows_where(~params.greedy)
    info = batch.sampling_info
    if rows:
        index = torch.tensor(rows, device=params.temperature.device)
        chosen = params.select(index)
        chosen.temperature = torch.ones_like(chosen.temperature)
        own = {i: random.rows[row] for i, row in enumerate(rows)}
        setattr(info, ATTRIBUTE, SeededRows(index, chosen, RowRandom(random.shared, own)))
    try:
        yield
    finally:
        if rows:
            delattr(info, ATTRIBUTE)


def sample_from_probs(original, sampler, probs: torch.Tensor, sampling_info, *args, **kwargs):
    """AROUND SGLang's ``Sampler._sample_from_probs``: the rows our worker marked redrawn (SGLang's draw for the
    others untouched, so the shared generator advances as it would). Its sampling-mask capture, the other value it
    returns, is None here: SGLang refuses ``return_sampling_mask`` with speculative decoding."""
    seeded = getattr(sampling_info, ATTRIBUTE, None)
    if seeded is None:
        return original(sampler, probs, sampling_info, *args, **kwargs)
    theirs = probs[seeded.rows]  # a copy: SGLang's filters may write into ``probs``
    tokens, capture = original(sampler, probs, sampling_info, *args, **kwargs)
    return seeded.redraw(tokens, theirs), capture
