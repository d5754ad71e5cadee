"""End-to-end losslessness of the reference generator at T > 0 (real target and draft modules, KV caches).

The first emitted token comes from the prefill; tokens 2 and 3 come from speculation. Their joint
distribution, marginalised over token 1, is computed exactly from the target and compared by chi-square
(alpha = 1e-3) with 6,000 generations run as one batch.
"""

import itertools

import pytest
import torch

from conftest import random_draft, tiny_llama
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.reference import SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams, target_probs
from stats_util import chi_square_pvalue

VOCAB, N, PROMPT = 12, 6000, [3, 7, 1, 4]
CONFIGS = {
    "chain-real": Eagle3Config.chain(3),
    "tree-real": Eagle3Config(depth=3, top_k=3, total_tokens=8),
    "tree-one_hot": Eagle3Config(depth=3, top_k=3, total_tokens=8, tree_sampler="one_hot"),
}


@pytest.fixture(scope="module")
def small():
    target = tiny_llama(num_layers=4, vocab=VOCAB, seed=5)
    with torch.no_grad():
        target.lm_head.weight.mul_(0.1)  # undo part of the sharpening: spread-out distributions
    return target, random_draft(target, draft_vocab=9, seed=6)


def exact_joint_2_3(target, params) -> torch.Tensor:
    one = SamplingParams.uniform(1, **params)
    with torch.no_grad():
        p1 = target_probs(target(torch.tensor([PROMPT])).logits[:, -1], one)[0]
        seqs = torch.tensor([PROMPT + [a, b] for a, b in itertools.product(range(VOCAB), repeat=2)])
        logits = target(seqs).logits
    many = SamplingParams.uniform(len(seqs), **params)
    p2 = target_probs(logits[:, -2], many).view(VOCAB, VOCAB, VOCAB)[:, 0]  # [x1, x2]
    p3 = target_probs(logits[:, -1], many).view(VOCAB, VOCAB, VOCAB)  # [x1, x2, x3]
    return (p1[:, None, None] * p2[:, :, None] * p3).sum(0)


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.8, top_p=0.9, top_k=8)],
                         ids=["T=1", "T=0.8,top_p,top_k"])
@pytest.mark.parametrize("name", CONFIGS)
def test_generator_samples_the_target_distribution(small, name, params):
    target, draft = small
    gen = SpeculativeGenerator(target, draft, CONFIGS[name])
    out = gen.generate([PROMPT] * N, max_new_tokens=3, params=SamplingParams.uniform(N, **params), seed=11)
    pairs = torch.tensor([t[1:3] for t in out.tokens])
    assert chi_square_pvalue(pairs[:, 0] * VOCAB + pairs[:, 1], exact_joint_2_3(target, params)) > 1e-3
    assert out.stats.accepted_tokens > 0 or name == "tree-one_hot"
