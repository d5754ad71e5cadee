"""The chi-square goodness-of-fit test every losslessness test uses."""

import torch
from scipy import stats


def chi_square_pvalue(cells: torch.Tensor, exact: torch.Tensor) -> float:
    """p-value of samples (``cells``: one cell index per sample) against cell probabilities ``exact``.

    Cells expected fewer than 5 times are pooled into one; a sample in a zero-probability cell gives 0.
    """
    observed = torch.bincount(cells.flatten(), minlength=exact.numel()).double()
    expected = exact.flatten().double() * cells.numel()
    if bool((observed[expected == 0] > 0).any()):
        return 0.0
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return float(stats.chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy()).pvalue)
