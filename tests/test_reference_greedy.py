"""Greedy speculative output is token-identical to transformers' greedy ``generate``."""

import pytest
import torch

from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.reference import SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams

CONFIGS = {
    "chain": Eagle3Config.chain(4),
    "tree": Eagle3Config(depth=4, top_k=3, total_tokens=10),
    "wide-tree": Eagle3Config(depth=2, top_k=5, total_tokens=20, tree_sampler="one_hot"),
}


def hf_greedy(target, prompt, max_new_tokens, eos):
    ids = torch.tensor([prompt])
    out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                          do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def prompts_of_many_lengths(vocab, count, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (count,), generator=g)
    return [torch.randint(3, vocab, (int(n),), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("name", CONFIGS)
def test_batched_greedy_matches_transformers(target, draft, name):
    prompts = prompts_of_many_lengths(target.config.vocab_size, 6)
    gen = SpeculativeGenerator(target, draft, CONFIGS[name])
    result = gen.generate(prompts, max_new_tokens=24, params=SamplingParams.uniform(len(prompts)), eos_token_id=2)
    for prompt, got in zip(prompts, result.tokens):
        assert got == hf_greedy(target, prompt, 24, eos=2)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 33])
def test_single_prompt_greedy_matches_transformers_at_any_length(target, draft, max_new_tokens):
    prompt = prompts_of_many_lengths(target.config.vocab_size, 1, seed=max_new_tokens)[0]
    gen = SpeculativeGenerator(target, draft, CONFIGS["tree"])
    result = gen.generate([prompt], max_new_tokens=max_new_tokens, params=SamplingParams.uniform(1))
    assert result.tokens[0] == hf_greedy(target, prompt, max_new_tokens, eos=None)
    assert len(result.tokens[0]) == max_new_tokens


def test_baseline_generation_matches_transformers(target, draft):
    prompts = prompts_of_many_lengths(target.config.vocab_size, 3, seed=9)
    gen = SpeculativeGenerator(target, draft, CONFIGS["chain"])
    result = gen.generate_baseline(prompts, 16, SamplingParams.uniform(3))
    assert result.tokens == [hf_greedy(target, p, 16, eos=None) for p in prompts]
    assert result.target_forwards == 16


def test_acceptance_statistics_are_consistent(target, draft):
    prompts = prompts_of_many_lengths(target.config.vocab_size, 4, seed=3)
    gen = SpeculativeGenerator(target, draft, CONFIGS["tree"])
    result = gen.generate(prompts, 20, SamplingParams.uniform(4))
    stats = result.stats
    assert stats.rounds >= 1 and len(stats.acceptance_rate_per_position) == 4
    rates = stats.acceptance_rate_per_position
    assert all(a >= b for a, b in zip(rates, rates[1:]))  # position i+1 is accepted only after position i
    assert stats.mean_acceptance_length == pytest.approx(1 + sum(stats.accepted_per_position) / stats.rounds)
