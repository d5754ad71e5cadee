"""The chi-square goodness-of-fit test every losslessness test uses, and the exact distribution engines are
tested against."""

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


def exact_second_token(target_dir: str, prompt: list[int], temperature: float, top_p: float) -> torch.Tensor:
    """The target's distribution of the second generated token, marginalised over the first (transformers,
    float32): the first token a speculative verifier decides."""
    from transformers import AutoModelForCausalLM

    from eagle3_plugin.sampler import SamplingParams, target_probs
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        p1 = target_probs(target(torch.tensor([prompt])).logits[:, -1],
                          SamplingParams.uniform(1, temperature=temperature, top_p=top_p))[0]
        support = torch.nonzero(p1 > 1e-7).flatten()
        seqs = torch.tensor([prompt + [int(t)] for t in support])
        p2 = target_probs(target(seqs).logits[:, -1], SamplingParams.uniform(len(seqs), temperature=temperature,
                                                                             top_p=top_p))
    return (p1[support, None] * p2).sum(0)
