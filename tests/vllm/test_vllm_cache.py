"""The draft's KV lives in vLLM's paged cache, so vLLM's prefix caching and preemption cover it.

- Prefix caching on (vLLM's default): requests sharing a 200-token prefix hit the cache (its hit counter rises),
  their greedy outputs equal transformers' greedy decoding, and our tree accepts exactly what it accepts with
  prefix caching off (the cached blocks' draft entries are reused, not recomputed).
- Preemption: a KV budget too small for every request at once makes vLLM preempt and later recompute requests;
  greedy outputs stay identical, and acceptance is the reference generator's but for the rounds preemption moved:
  vLLM drops a preempted request's draft tokens and its resumed prefill samples one token plainly, so each resume
  shifts where later rounds begin (at most one round more or fewer per preemption).
- The same when two steps of every three draft nothing (as the auto budget does under load): those steps defer
  their draft entries until the next tree or until a block changes owner. Greedy outputs stay identical, and the
  trees accept exactly what they accept when every such step stores its entries at once (a deferred entry lost or
  written to another request's slot would change what later trees accept); and every such step's entries, their slots
  read off vLLM's slot mapping, are the ones each row's slot table gives.
"""

import pytest
from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET, hf_greedy, shared_prefix_prompts
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.reference import AcceptanceStats, SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams
from vllm_support import run_llm

MAX_TOKENS = 48
TREE = Eagle3Config(draft=DRAFT, layer_ids=(1, 3, 5), mode="tree", depth=5, top_k=8, total_tokens=32,
                    budget="fixed").to_dict()
SPEC_KEYS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens",
             "vllm:spec_decode_num_accepted_tokens_per_pos")


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TARGET)


@pytest.fixture(scope="module")
def prefix_prompts(tokenizer):
    """Six prompts: one 200-token prefix (held-out code), then each its own held-out prompt."""
    return shared_prefix_prompts(tokenizer)


def test_prefix_caching_reuses_the_drafts_kv(prefix_prompts):
    batches = [prefix_prompts[:1], prefix_prompts[1:]]  # the first request fills the cache
    runs = {cached: run_llm(dict(target=TARGET, speculative_config=TREE, batches=batches, temperature=0.0,
                                 max_tokens=MAX_TOKENS, engine=dict(enable_prefix_caching=cached, block_size=32,
                                                                    max_model_len=1024)))["batches"]
            for cached in (True, False)}
    on, off = runs[True], runs[False]
    assert on[1]["metrics"]["vllm:prefix_cache_hits"] >= 5 * 160  # each later request: 5 blocks of 32 (eagle drops one)
    assert off[1]["metrics"].get("vllm:prefix_cache_hits", 0) == 0
    want = hf_greedy(prefix_prompts, MAX_TOKENS)
    assert on[0]["tokens"] + on[1]["tokens"] == want == off[0]["tokens"] + off[1]["tokens"]
    for key in SPEC_KEYS:
        assert on[1]["metrics"][key] == off[1]["metrics"][key], key


def preempted_run(prompts, config: dict, **more) -> dict:
    # 12 requests need about 60 blocks of 32 tokens at once (prompt, 48 new tokens, 31 draft slots); give 14.
    out = run_llm(dict(target=TARGET, speculative_config=config, prompts=prompts, temperature=0.0,
                       max_tokens=MAX_TOKENS, engine=dict(block_size=32, num_gpu_blocks_override=14, max_model_len=256),
                       **more))
    assert out["metrics"]["vllm:num_preemptions"] > 0
    assert out["tokens"] == hf_greedy(prompts, MAX_TOKENS)
    return out["metrics"]


def reference_stats(prompts, config: Eagle3Config) -> AcceptanceStats:
    gen = SpeculativeGenerator.from_pretrained(TARGET, config)
    ref = AcceptanceStats(config.depth)
    for p in prompts:
        ref.merge(gen.generate([p], MAX_TOKENS, SamplingParams.uniform(1)).stats)
    return ref


def test_preemption_keeps_outputs_and_acceptance(tokenizer):
    prompts = [encode_prompt(tokenizer, r.prompt) for r in read_prompts(HELDOUT)[:12]]
    metrics = preempted_run(prompts, TREE)
    ref = reference_stats(prompts, Eagle3Config.from_dict(TREE))
    rounds, preemptions = metrics["vllm:spec_decode_num_drafts"], metrics["vllm:num_preemptions"]
    assert abs(rounds - ref.rounds) <= preemptions
    mal = 1 + metrics["vllm:spec_decode_num_accepted_tokens"] / rounds
    assert mal == pytest.approx(ref.mean_acceptance_length, rel=0.05)


def test_preemption_with_steps_that_draft_nothing(tokenizer):
    prompts = [encode_prompt(tokenizer, r.prompt) for r in read_prompts(HELDOUT)[:12]]
    cycle = ["tree", "none", "none"]
    deferred = preempted_run(prompts, TREE, shape_cycle=cycle, check_entries=True)
    at_once = preempted_run(prompts, TREE, shape_cycle=cycle, defer_steps=1)
    for key in SPEC_KEYS:
        assert deferred[key] == at_once[key], key
