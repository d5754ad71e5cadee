"""The target's sampling law written independently of ``eagle3_plugin.sampler`` (numpy, float64), to test it.

p = softmax(logits / T) restricted by min-p, then top-k, then top-p, renormalised each time (vLLM's order):
- min-p keeps every token whose probability is at least ``min_p`` times the most probable's;
- top-k keeps every token whose scaled logit is at least the k-th largest (ties at the k-th value all stay);
- top-p orders tokens by probability, the larger first and, among equal ones, the lower token id first, and keeps
  the shortest prefix whose mass reaches p (a boundary exactly on a cumulative sum ends the prefix there);
- T = 0 is greedy: all mass on the first argmax.

``joint=True`` is SGLang's order instead: both filters read softmax(logits / T) itself; a token stays if it is among
the k most probable (the lower id first among equal ones) and the mass ranked above it is at most p; then min-p
drops those kept whose probability is below ``min_p`` times the most probable's.
"""

import numpy as np


def target_law(logits, temperature: float, top_k: int = 0, top_p: float = 1.0, joint: bool = False,
               min_p: float = 0.0) -> np.ndarray:
    logits = np.asarray(logits, dtype=np.float64)
    if temperature <= 0:
        out = np.zeros_like(logits)
        out[int(np.argmax(logits))] = 1.0
        return out
    scaled = logits / temperature
    if joint:
        return _joint_law(scaled, top_k, top_p, min_p)
    keep = np.ones(scaled.shape, dtype=bool)
    if min_p > 0:
        probs = np.exp(scaled - scaled.max())
        keep &= probs / probs.sum() >= min_p * probs.max() / probs.sum()
    if 0 < top_k < scaled.size:
        kth = np.sort(scaled)[::-1][top_k - 1]
        keep &= scaled >= kth
    probs = np.where(keep, np.exp(scaled - scaled[keep].max()), 0.0)
    probs /= probs.sum()
    if top_p < 1:
        order = sorted(range(probs.size), key=lambda i: (-probs[i], i))
        mass, kept = 0.0, []
        for i in order:
            if mass >= top_p:
                break
            kept.append(i)
            mass += probs[i]
        mask = np.zeros(probs.shape, dtype=bool)
        mask[kept] = True
        probs = np.where(mask, probs, 0.0)
        probs /= probs.sum()
    return probs


def _joint_law(scaled: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    order = sorted(range(probs.size), key=lambda i: (-probs[i], i))
    kept, above = [], 0.0
    for rank, i in enumerate(order):
        if (0 < top_k <= rank) or above > top_p:
            break
        if probs[i] >= min_p * probs[order[0]]:
            kept.append(i)
        above += probs[i]
    out = np.zeros_like(probs)
    out[kept] = probs[kept]
    return out / out.sum()
