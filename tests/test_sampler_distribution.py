"""Losslessness: speculative output has exactly the target's distribution (chi-square, alpha = 1e-3); a wrong
sampler and three subtle mistakes (q at the wrong temperature, a residual not renormalised, siblings verified out
of their sampling order) fail the same test with p < 1e-6.

Each case draws 20,000 independent runs of the tree builder + sampler on a toy bigram target and
compares the joint distribution of the first two emitted tokens (36 cells) with the exact one. A
known-wrong sampler (accept every draft token) must fail the same test with p < 1e-6.
"""

import pytest
import torch

from eagle3_plugin.sampler import SamplingParams, Verdict, unscored_to_bonus, verify_tree
from eagle3_plugin.tree import build_tree
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
    "T=1.2,top_p=0.9,min_p=0.2 (joint)": dict(temperature=1.2, top_p=0.9, min_p=0.2, filter_order="joint"),
    "T=1.2,top_k=4,min_p=0.2 (sequential)": dict(temperature=1.2, top_k=4, min_p=0.2),
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


class LeadingPaths(Bigram):
    """Every tree cut to its leading path before verification, as vLLM's worker does for requests with a grammar."""

    def one_round(self, roots, depth, top_k, total, params, method, sample, generator, verify=verify_tree):
        tree = build_tree(roots, self.draft[roots], lambda level, tokens, parent_slot: self.draft[tokens], depth,
                          top_k, total, params.temperature, sample, self.hot_ids, generator)
        tree, _ = tree.leading_paths(torch.ones(roots.shape[0], dtype=torch.bool))
        return tree, verify(tree, self.target[tree.tokens], params, method, generator)


@pytest.mark.parametrize("params_name", PARAMS)
def test_a_trees_leading_path_is_a_lossless_chain(params_name):
    depth, top_k, total, method, sample = CASES["tree-real"]
    toy = LeadingPaths(seed=1)
    samples = toy.sample_two_tokens(N, root=0, depth=depth, top_k=top_k, total=total,
                                    params_row=PARAMS[params_name], method=method, sample=sample, seed=7)
    assert pairs_pvalue(samples, toy.exact_two_token(0, SamplingParams.uniform(1, **PARAMS[params_name]))) > ALPHA


class GrammarCut(Bigram):
    """A grammar the draft does not see (``allowed [previous, next]``; the target's logits masked by it), and an
    engine that verifies each tree's leading path only up to its first draft token the grammar forbids, as vLLM does
    (its scheduler drops a chain's draft tokens from the first invalid one). ``verify_cut_child``: the first dropped
    token is still verified, as an unscored leaf (:func:`unscored_to_bonus`); else the bonus comes from ``p`` at the
    cut, vLLM's own rule."""

    def __init__(self, verify_cut_child: bool):
        super().__init__(seed=1)
        self.allowed = torch.rand(self.vocab, self.vocab, generator=torch.Generator().manual_seed(11)) < 0.6
        self.allowed[:, 0] = True  # every state allows some token
        self.target = self.target.masked_fill(~self.allowed, float("-inf"))
        self.verify_cut_child = verify_cut_child

    def one_round(self, roots, depth, top_k, total, params, method, sample, generator, verify=verify_tree):
        tree = build_tree(roots, self.draft[roots], lambda level, tokens, parent_slot: self.draft[tokens], depth,
                          top_k, total, params.temperature, sample, self.hot_ids, generator)
        chain, length = tree.leading_paths(torch.ones(roots.shape[0], dtype=torch.bool))
        valid = self.allowed[chain.tokens[:, :-1], chain.tokens[:, 1:]]
        valid &= torch.arange(1, chain.size)[None] < length[:, None]
        scored = 1 + valid.long().cumprod(1).sum(1)  # the root and the valid drafts before the first invalid one
        kept = torch.minimum(scored + 1, length) if self.verify_cut_child else scored
        chain = chain.truncated(kept)
        verdict = verify(chain, self.target[chain.tokens], params, method, generator)
        return chain, unscored_to_bonus(verdict, chain, scored) if self.verify_cut_child else verdict


@pytest.mark.parametrize("params_name", PARAMS)
def test_a_chain_cut_at_its_first_forbidden_draft_is_lossless_when_the_cut_child_is_verified(params_name):
    depth, top_k, total, method, sample = CASES["tree-real"]
    toy = GrammarCut(verify_cut_child=True)
    samples = toy.sample_two_tokens(N, root=0, depth=depth, top_k=top_k, total=total,
                                    params_row=PARAMS[params_name], method=method, sample=sample, seed=7)
    assert pairs_pvalue(samples, toy.exact_two_token(0, SamplingParams.uniform(1, **PARAMS[params_name]))) > ALPHA


def test_a_bonus_drawn_from_p_at_such_a_cut_leaves_the_targets_law():
    depth, top_k, total, method, sample = CASES["tree-real"]
    toy = GrammarCut(verify_cut_child=False)
    samples = toy.sample_two_tokens(N, root=0, depth=depth, top_k=top_k, total=total,
                                    params_row=dict(temperature=1.0), method=method, sample=sample, seed=7)
    assert pairs_pvalue(samples, toy.exact_two_token(0, SamplingParams.uniform(1, temperature=1.0))) < 1e-6


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


# Subtle mistakes a sampler could make, each of which must fail the same test.

def q_at_the_wrong_temperature(toy):
    """Children drawn from the draft at T, but verified against q at 2T."""
    def verify(tree, target_logits, params, method, generator):
        t = params.temperature[:, None, None] * 2
        wrong = torch.softmax(toy.draft[tree.tokens] / t, dim=-1)
        tree.draft_probs = torch.where(tree.draft_probs.sum(-1, keepdim=True) > 0, wrong, tree.draft_probs)
        return verify_tree(tree, target_logits, params, method, generator)
    return verify


def residual_not_renormalised(tree, target_logits, params, method, generator):
    import eagle3_plugin.sampler as sampler
    original = sampler._normalize
    sampler._normalize = lambda x, fallback: torch.where(x.sum(-1, keepdim=True) > 0, x, fallback)
    try:
        return verify_tree(tree, target_logits, params, method, generator)
    finally:
        sampler._normalize = original


def siblings_out_of_order(tree, target_logits, params, method, generator):
    from eagle3_plugin.tree import DraftTree
    original = DraftTree.children

    def reversed_children(self, max_children):
        kids = original(self, max_children)
        count = (kids >= 0).sum(-1, keepdim=True)
        index = (count - 1 - torch.arange(kids.shape[-1])).clamp(min=0)
        return torch.where(torch.arange(kids.shape[-1]) < count, kids.gather(-1, index), -1)
    DraftTree.children = reversed_children
    try:
        return verify_tree(tree, target_logits, params, method, generator)
    finally:
        DraftTree.children = original


@pytest.mark.parametrize("mistake", ["q at the wrong temperature", "residual not renormalised",
                                     "siblings out of sampling order"])
def test_subtle_mistakes_fail_the_same_test(mistake):
    depth, top_k, total, method, sample = CASES["tree-real"]
    toy = Bigram(seed=1)
    verify = {"q at the wrong temperature": q_at_the_wrong_temperature(toy),
              "residual not renormalised": residual_not_renormalised,
              "siblings out of sampling order": siblings_out_of_order}[mistake]
    samples = toy.sample_two_tokens(N, root=0, depth=depth, top_k=top_k, total=total,
                                    params_row=dict(temperature=1.0), method=method, sample=sample, seed=7,
                                    verify=verify)
    exact = toy.exact_two_token(0, SamplingParams.uniform(1, temperature=1.0))
    assert pairs_pvalue(samples, exact) < 1e-6


@pytest.mark.parametrize("params_name", ["T=1", "T=0.7,top_k=3"])
def test_masked_ids_beyond_the_drafts_support_stay_lossless(params_name):
    """Output rules that mask ids (allowed ids, bad words, min_tokens) leave the draft fewer ids than top_k: each
    node still grows top_k children, the masked ones at draft probability 0 (the speculator's finite masked logit),
    and target probability 0. The emitted tokens keep the masked target's law; masked ids never appear."""
    from eagle3_plugin.speculator import MASKED_DRAFT_LOGIT

    toy = Bigram(seed=1)
    allowed = torch.cat([toy.hot_ids[:2], torch.tensor([i for i in range(toy.vocab) if i not in toy.hot_ids])])
    masked = torch.ones(toy.vocab, dtype=torch.bool)
    masked[allowed] = False  # two of the draft's ids, and the one id only the target has
    toy.target = toy.target.masked_fill(masked, float("-inf"))
    toy.draft = toy.draft.masked_fill(masked[toy.hot_ids], MASKED_DRAFT_LOGIT)
    root = int(allowed[0])
    samples = toy.sample_two_tokens(N, root=root, depth=3, top_k=3, total=8, params_row=PARAMS[params_name],
                                    method="real", sample=True, seed=11)
    exact = toy.exact_two_token(root, SamplingParams.uniform(1, **PARAMS[params_name]))
    assert not bool(masked[samples].any())
    assert pairs_pvalue(samples, exact) > ALPHA
