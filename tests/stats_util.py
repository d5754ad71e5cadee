"""The chi-square goodness-of-fit test every losslessness test uses, and the exact law engines are tested against."""

from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from target_law import target_law


def chi_square_pvalue(cells: torch.Tensor, exact: torch.Tensor) -> float:
    """p-value of samples (``cells``: one cell index per sample) against cell probabilities ``exact``.

    Cells expected fewer than 5 times are pooled into one; a sample in a zero-probability cell gives 0; samples all
    in the one cell with mass (a greedy law) give 1. Pearson's statistic; its p-value is the chi-square tail outside
    [1e-6, 0.01) (above every alpha the tests use; below them all, where a wrong sampler must land and 200,000 draws
    resolve nothing), else the Monte Carlo tail of the same statistic under the exact law (:func:`_simulated_tail`):
    with cells expected 5-10 times, as here, the chi-square tail at 1e-3 is 1.5x-1.9x too light (measured on the
    law tests' own laws), so a test at alpha 1e-3 would fail up to twice as often as it says.
    """
    observed = torch.bincount(cells.flatten(), minlength=exact.numel()).double()
    expected = exact.flatten().double() * cells.numel()
    if bool((observed[expected == 0] > 0).any()):
        return 0.0
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep].numpy(), exp[keep].numpy()
    if obs.size == 1:
        return 1.0
    exp = exp * obs.sum() / exp.sum()
    result = stats.chisquare(obs, exp)
    if not 1e-6 <= result.pvalue < 0.01:  # above every alpha here, or below them all and what the draws resolve
        return float(result.pvalue)
    return _simulated_tail(float(result.statistic), exp)


def _simulated_tail(statistic: float, expected: np.ndarray, draws: int = 200_000) -> float:
    """P(Pearson's statistic >= ``statistic``) for multinomial counts with means ``expected``: ``draws`` simulated
    samples (a fixed seed, so a sample's p-value never changes), ``(1 + hits) / (1 + draws)``."""
    rng = np.random.default_rng(0)
    n, probs = int(round(expected.sum())), expected / expected.sum()
    hits = 0
    for chunk in range(0, draws, 20_000):
        counts = rng.multinomial(n, probs, size=min(20_000, draws - chunk))
        hits += int((((counts - expected) ** 2 / expected).sum(1) >= statistic * (1 - 1e-12)).sum())
    return (1 + hits) / (1 + draws)


@dataclass
class PathLaw:
    """The exact law of a request's first ``length`` generated tokens: every path of at least ``floor`` probability
    is a cell, and one last cell holds the exact mass of all the others; and the first token's own law over the
    whole vocabulary, zeros included (a token outside the support, which the paths' rest cell would hide among many
    expected samples, fails it outright)."""

    length: int
    paths: dict  # path (tuple of ``length`` token ids) -> cell index
    probs: torch.Tensor  # [len(paths) + 1] float64, the last entry the pooled rest
    first: torch.Tensor  # [V] float64: the first token's law

    def cells(self, generations) -> torch.Tensor:
        rest = len(self.paths)
        return torch.tensor([self.paths.get(tuple(g[:self.length]), rest) for g in generations])

    def pvalue(self, generations) -> float:
        """p-value of generations (each a list of token ids, at least ``length`` long) against the law: the smaller of
        the paths' and the first token's chi-square p-values, doubled (Bonferroni: the test keeps its alpha)."""
        paths = chi_square_pvalue(self.cells(generations), self.probs)
        first = chi_square_pvalue(torch.tensor([g[0] for g in generations]), self.first)
        return min(1.0, 2 * min(paths, first))


def path_law(target_dir: str, prompt: list[int], length: int, temperature: float, top_k: int = 0,
             top_p: float = 1.0, floor: float = 1e-3, joint: bool = False, min_p: float = 0.0,
             allowed=None) -> PathLaw:
    """The target's joint law of the first ``length`` generated tokens (transformers, float32 logits), built with the
    numpy reference ``target_law`` (``joint``: SGLang's top-k/top-p/min-p order), not with the sampler under test. A
    prefix below ``floor`` is not expanded: its whole mass goes to the rest cell, as does that of every full path
    below ``floor``. ``allowed(prefix) -> bool [V]``: a grammar's ids after ``prefix`` (the generated tokens so far);
    the others' logits are -inf, as an engine's grammar mask sets them."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    level = {(): 1.0}  # prefix -> its probability; only prefixes at or above the floor
    for _ in range(length):
        prefixes = list(level)
        with torch.no_grad():
            logits = target(torch.tensor([prompt + list(p) for p in prefixes])).logits[:, -1].double().numpy()
        grown = {}
        for prefix, row in zip(prefixes, logits):
            if allowed is not None:
                row = np.where(allowed(prefix), row, -np.inf)
            probs = level[prefix] * target_law(row, temperature, top_k, top_p, joint, min_p)
            if not prefix:  # the first level's one prefix
                first = torch.from_numpy(probs)
            for token in np.flatnonzero(probs >= floor):
                grown[prefix + (int(token),)] = float(probs[token])
        level = grown
    kept = torch.tensor(list(level.values()), dtype=torch.float64)
    probs = torch.cat([kept, (1 - kept.sum()).clamp(min=0)[None]])
    return PathLaw(length, {path: cell for cell, path in enumerate(level)}, probs, first)
