"""``sampler.target_probs`` against a reference written separately (tests/target_law.py, numpy), on hand-checked cases
(ties at the k-th value, a top-p boundary exactly on a cumulative sum) and random ones; and against vLLM's own min-p
(``MinPLogitsProcessor``) and top-k/top-p (``apply_top_k_top_p_pytorch``): the same support on random logits. Where
ours and vLLM's differ by design: vLLM orders tokens by an unstable ascending sort, so which of several
equal-probability tokens survives at a top-p boundary is up to its sort; ours keeps the lower token id (stable).
SGLang's joint order (min-p included) is checked against the reference here, and against SGLang's own filter in
tests/sglang/test_sglang_plugin.py."""

import math

import numpy as np
import pytest
import torch

from eagle3_plugin.sampler import SamplingParams, target_probs
from target_law import target_law


def ours(logits, temperature, top_k=0, top_p=1.0, joint=False, min_p=0.0):
    params = SamplingParams.uniform(1, temperature, top_k, top_p, filter_order="joint" if joint else "sequential",
                                    min_p=min_p)
    return target_probs(torch.tensor([logits], dtype=torch.float32), params)[0].double().numpy()


HAND = [  # (logits, T, top_k, top_p, expected probabilities)
    ([2.0, 1.0, 1.0, 0.0], 1.0, 2, 1.0,  # the k-th value is tied: both stay
     [math.e ** 2, math.e, math.e, 0.0]),
    ([0.0, 0.0, 0.0, 0.0], 1.0, 0, 0.5,  # 0.25 + 0.25 reaches 0.5 exactly: the prefix ends there, lower ids first
     [0.5, 0.5, 0.0, 0.0]),
    ([0.0, 0.0, 0.0, 0.0], 1.0, 0, 0.5000001, [1 / 3, 1 / 3, 1 / 3, 0.0]),  # just past it: one more token
    ([1.0, 3.0, 2.0], 0.5, 0, 1.0, [math.e ** 2, math.e ** 6, math.e ** 4]),  # temperature divides the logits
    ([1.0, 3.0, 3.0], 0.0, 0, 1.0, [0.0, 1.0, 0.0]),  # greedy: the first argmax
    ([4.0, 3.0, 2.0, 1.0], 1.0, 3, 0.9, None),  # top-k then top-p on the renormalised rest
]


@pytest.mark.parametrize("case", range(len(HAND)))
def test_hand_checked_cases(case):
    logits, t, k, p, expected = HAND[case]
    want = target_law(logits, t, k, p)
    if expected is not None:
        expected = np.array(expected) / np.sum(expected)
        assert want == pytest.approx(expected, abs=1e-12)  # the reference itself, by hand
    assert ours(logits, t, k, p) == pytest.approx(want, abs=1e-6)


def test_top_k_then_top_p_by_hand():
    probs = np.exp([4.0, 3.0, 2.0]) / np.exp([4.0, 3.0, 2.0]).sum()  # after top-k 3: [0.665, 0.245, 0.090]
    assert probs[0] < 0.9 < probs[0] + probs[1]
    assert target_law([4.0, 3.0, 2.0, 1.0], 1.0, 3, 0.9) == pytest.approx(
        [probs[0] / (probs[0] + probs[1]), probs[1] / (probs[0] + probs[1]), 0, 0])


@pytest.mark.parametrize("joint", [False, True], ids=["sequential", "joint"])
def test_random_cases_agree(joint):
    g = np.random.default_rng(0)
    for _ in range(300):
        v = int(g.integers(2, 50))
        logits = (g.normal(size=v) * g.uniform(0.5, 4)).tolist()
        t = float(g.choice([0.0, 0.3, 0.7, 1.0, 1.5]))
        k = int(g.choice([0, 1, 2, 5, v]))
        p = float(g.choice([1.0, 0.95, 0.8, 0.5, 0.1]))
        assert ours(logits, t, k, p, joint) == pytest.approx(target_law(logits, t, k, p, joint), abs=1e-5)


@pytest.mark.parametrize("joint", [False, True])
def test_random_cases_with_min_p_agree(joint):
    g = np.random.default_rng(1)
    for _ in range(300):
        v = int(g.integers(2, 50))
        logits = (g.normal(size=v) * g.uniform(0.5, 4)).tolist()
        t = float(g.choice([0.0, 0.7, 1.0, 1.5]))
        k, p = int(g.choice([0, 2, 5, v])), float(g.choice([1.0, 0.9, 0.5]))
        m = float(g.choice([0.0, 0.05, 0.2, 0.6]))
        assert ours(logits, t, k, p, joint, m) == pytest.approx(target_law(logits, t, k, p, joint, m), abs=1e-5)


def test_min_p_by_hand():
    # softmax [2, 1, 0, -1] = [0.644, 0.237, 0.087, 0.032]: min_p 0.3 keeps ids at or above 0.193, the first two;
    # min_p exactly at the second's ratio keeps it (SGLang drops only below); min_p after top-k reads the first's
    logits = [2.0, 1.0, 0.0, -1.0]
    probs = np.exp(logits) / np.exp(logits).sum()
    want = np.array([*probs[:2], 0, 0]) / probs[:2].sum()
    assert target_law(logits, 1.0, 0, 1.0, True, 0.3) == pytest.approx(want, abs=1e-12)
    assert ours(logits, 1.0, 0, 1.0, True, 0.3) == pytest.approx(want, abs=1e-6)
    assert np.count_nonzero(target_law(logits, 1.0, 0, 1.0, True, float(probs[2] / probs[0]))) == 3
    assert np.count_nonzero(target_law(logits, 1.0, 1, 1.0, True, 0.01)) == 1
    # min_p 0.1 keeps the first three (at or above 0.0644); top-p 0.9 then reads them renormalised in vLLM's order,
    # [0.665, 0.245, 0.090]: the first two reach 0.91, so two stay; SGLang's joint top-p reads 0.881 above the third
    assert np.count_nonzero(target_law(logits, 1.0, 0, 0.9, False, 0.1)) == 2
    assert np.count_nonzero(ours(logits, 1.0, 0, 0.9, False, 0.1)) == 2
    assert np.count_nonzero(ours(logits, 1.0, 0, 0.9, True, 0.1)) == 3


def test_joint_order_by_hand():
    # softmax [4, 3, 2, 1] = [0.644, 0.237, 0.087, 0.032]; top-k 3 keeps 0.968 of the mass
    # sequential: renormalised, 0.665 + 0.245 reaches 0.9 -> two tokens; joint: 0.644 + 0.237 = 0.881 <= 0.9 -> three
    logits, probs = [4.0, 3.0, 2.0, 1.0], np.exp([4.0, 3.0, 2.0, 1.0]) / np.exp([4.0, 3.0, 2.0, 1.0]).sum()
    want = np.array([*probs[:3], 0.0]) / probs[:3].sum()
    assert target_law(logits, 1.0, 3, 0.9, joint=True) == pytest.approx(want, abs=1e-12)
    assert ours(logits, 1.0, 3, 0.9, joint=True) == pytest.approx(want, abs=1e-6)
    assert np.count_nonzero(target_law(logits, 1.0, 3, 0.9)) == 2
    # the mass above a token exactly at top_p keeps it (SGLang drops only above): 0.25 + 0.25 = 0.5 keeps a third
    assert target_law([0.0] * 4, 1.0, 0, 0.5, joint=True) == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0], abs=1e-12)
    assert ours([0.0] * 4, 1.0, 0, 0.5, joint=True) == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0], abs=1e-6)


def test_an_unknown_filter_order_is_refused():
    with pytest.raises(ValueError, match="filter order"):
        SamplingParams.uniform(1, 1.0, filter_order="top_p_first")


def test_vllm_top_k_top_p_has_the_same_support():
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        logits = torch.randn(4, 64, generator=g) * 3
        k = torch.randint(1, 64, (4,), generator=g)
        p = torch.rand(4, generator=g) * 0.9 + 0.05
        theirs = apply_top_k_top_p_pytorch(logits.clone(), k, p)
        mine = target_probs(logits, SamplingParams(torch.ones(4), k, p))
        assert torch.equal(torch.isfinite(theirs), mine > 0)
        assert torch.allclose(torch.softmax(theirs, -1), mine, atol=1e-6)


def test_vllm_min_p_then_top_k_top_p_has_the_same_support():
    from types import SimpleNamespace

    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=4))
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        logits = torch.randn(4, 64, generator=g) * 3
        k = torch.randint(1, 64, (4,), generator=g)
        p = torch.rand(4, generator=g) * 0.9 + 0.05
        m = torch.rand(4, generator=g) * 0.3
        min_p = MinPLogitsProcessor(config, torch.device("cpu"), False)
        min_p.min_p_count, min_p.min_p = 4, m[:, None]  # the rows' state as its update_state leaves it
        theirs = apply_top_k_top_p_pytorch(min_p.apply(logits.clone()), k, p)
        mine = target_probs(logits, SamplingParams(torch.ones(4), k, p, min_p=m))
        assert torch.equal(torch.isfinite(theirs), mine > 0)
        assert torch.allclose(torch.softmax(theirs, -1), mine, atol=1e-6)
