"""A target without ``SupportsEagle3`` in vLLM (Glm4) runs EAGLE-3 through our capture, with vLLM's native
chain and with our tree worker, with exactly the reference generator's acceptance (which captures from
transformers' hidden states): the captured values are right, not only their shapes."""

import pytest
import torch
from torch import nn
from transformers import AutoTokenizer

from bundled import HELDOUT
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.reference import AcceptanceStats, SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams
from eagle3_plugin.vllm.capture import UnsupportedTarget, residual_stream_reader
from vllm_support import run_llm

DEPTH, MAX_TOKENS = 3, 32


@pytest.fixture(scope="module")
def prompts(glm4):
    tok = AutoTokenizer.from_pretrained(glm4[0])
    return [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:6]]


@pytest.fixture(scope="module")
def plain(glm4, prompts):
    return run_llm(dict(target=glm4[0], prompts=prompts, temperature=0.0, max_tokens=MAX_TOKENS))


@pytest.mark.parametrize("worker", ["native-chain", "our-tree"])
def test_glm4_target_through_our_capture_matches_the_reference(glm4, prompts, plain, worker):
    from vllm.model_executor.models.glm4 import Glm4ForCausalLM
    from vllm.model_executor.models.interfaces import supports_eagle3
    assert not supports_eagle3(Glm4ForCausalLM)  # stock vLLM cannot feed an EAGLE-3 draft from it

    target, draft = glm4
    if worker == "native-chain":
        config = Eagle3Config.chain(DEPTH, draft=draft, layer_ids=(1, 3, 5), budget="fixed")
        spec = run_llm(dict(target=target, draft=draft, prompts=prompts, temperature=0.0, max_tokens=MAX_TOKENS,
                            num_speculative_tokens=DEPTH))
    else:
        config = Eagle3Config(draft=draft, layer_ids=(1, 3, 5), mode="tree", depth=DEPTH, top_k=4, total_tokens=12,
                              budget="fixed")
        spec = run_llm(dict(target=target, speculative_config=config.to_dict(), prompts=prompts, temperature=0.0,
                            max_tokens=MAX_TOKENS))
    assert spec["tokens"] == plain["tokens"]

    gen = SpeculativeGenerator.from_pretrained(target, config)
    stats = AcceptanceStats(DEPTH)
    for prompt in prompts:
        stats.merge(gen.generate([prompt], MAX_TOKENS, SamplingParams.uniform(1)).stats)
    assert stats.accepted_tokens > 0
    assert spec["metrics"]["vllm:spec_decode_num_drafts"] == stats.rounds
    assert spec["metrics"]["vllm:spec_decode_num_accepted_tokens"] == stats.accepted_tokens


def test_stream_reading_rules():
    class Fused(nn.Module):
        input_layernorm = nn.Identity()

        def forward(self, positions, hidden_states, residual):
            return hidden_states

    class Plain(nn.Module):
        def forward(self, hidden_states, attention_mask=None):
            return hidden_states

    class PostNorm(nn.Module):  # takes a residual it ignores (Exaone4-style): unreadable
        def forward(self, positions, hidden_states, residual):
            return hidden_states

    h, r = torch.ones(2, 4), torch.full((2, 4), 2.0)
    assert torch.equal(residual_stream_reader(Fused())((None, h, r), {}), h + r)
    assert torch.equal(residual_stream_reader(Fused())((None, h, None), {}), h)
    assert torch.equal(residual_stream_reader(Plain())((h,), {}), h)
    with pytest.raises(UnsupportedTarget, match="no fused input_layernorm"):
        residual_stream_reader(PostNorm())
