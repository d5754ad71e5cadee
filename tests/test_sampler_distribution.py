"""Losslessness: speculative output has exactly the target's distribution (chi-square, alpha = 1e-3).

Each case draws 20,000 independent runs of the tree builder + sampler on a toy bigram target and
compares the joint distribution of the first two emitted tokens (36 cells) with the exact one. A
known-wrong sampler (accept every draft token) must fail the same test with p < 1e-6.
"""

import pytest
import torch

from eagle3_plugin.sampler import SamplingParams, Verdict, verify_tree
from stats_util import chi_square_pvalue
from toy import Bigram

ALPHA = 1e-3
N = 20_000
CASES = {  # name: (depth, top_k, total, method, sample)
    "chain-real": (3, 1, 4, "real", True),
    "tree-real": (3, 3, 8, "real", True),
    "tree-one_hot": (3, 3, 8, "one_hot", False),
    "tree-one_hot-on-sampled-tree": (3, 3, 8, "one_hot", True),
}
PARAMS = {
    "T=1": dict(temperature=1.0),
    "T=0.7,top_k=3": dict(temperature=0.7, top_k=3),
    "T=1.3,top_p=0.8": dict(temperature=1.3, top_p=0.8),
}


def pairs_pvalue(samples: torch.Tensor, exact: torch.Tensor) -> float:
    v = exact.shape[0]
    return chi_square_pvalue(samples[:, 0] * v + samples[:, 1], exact)


@pytest.mark.parametrize("params_name", PARAMS)
@pytest.mark.parametrize("case", CASES)
def test_two_token_distribution_is_the_target(case, params_name):
    depth, top_k, total, method, sample = CASES[case]
    toy = Bigram(seed=1)
    samples = toy.sample_two_tokens(N, root=0, depth=depth, top_k=top_k, total=total,
                                    params_row=PARAMS[params_name], method=method, sample=sample, seed=7)
    exact = toy.exact_two_token(0, SamplingParams.uniform(1, **PARAMS[params_name]))
    first = torch.bincount(samples[:, 0], minlength=toy.vocab).double() / N
    assert (first - exact.sum(1)).abs().sum() / 2 < 0.02, "first-token total variation above 0.02"
    assert pairs_pvalue(samples, exact) > ALPHA


def accept_everything(tree, target_logits, params, method, generator):
    """A known-wrong sampler: always accepts the first child down to a leaf."""
    verdict = verify_tree(tree, target_logits, params, method, generator)
    children = tree.children(tree.size)
    rows = torch.arange(tree.tokens.shape[0])
    cur = torch.zeros_like(verdict.bonus)
    accepted = torch.full_like(verdict.accepted, -1)
    accepted[:, 0] = 0
    for level in range(1, accepted.shape[1]):
        nxt = children[rows, cur, 0]
        accepted[:, level] = nxt
        cur = torch.where(nxt >= 0, nxt, cur)
    return Verdict(accepted, (accepted[:, 1:] >= 0).sum(1), verdict.bonus)


@pytest.mark.parametrize("case", ["chain-real", "tree-real"])
def test_known_wrong_sampler_fails_the_same_test(case):
    depth, top_k, total, method, sample = CASES[case]
    toy = Bigram(seed=1)
    samples = toy.sample_two_tokens(N, root=0, depth=depth, top_k=top_k, total=total,
                                    params_row=dict(temperature=1.0), method=method, sample=sample, seed=7,
                                    verify=accept_everything)
    exact = toy.exact_two_token(0, SamplingParams.uniform(1, temperature=1.0))
    assert pairs_pvalue(samples, exact) < 1e-6
