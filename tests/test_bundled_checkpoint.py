"""The bundled target + draft: greedy identity with transformers on held-out prompts, and the
acceptance properties the core promises (tree beats chain, real-probability beats q one-hot)."""


import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.checkpoint import load_draft
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.reference import AcceptanceStats, SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams


@pytest.fixture(scope="module")
def setup():
    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(TARGET)
    prompts = [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)]
    return target, load_draft(DRAFT), Eagle3Config.load(DRAFT), prompts


def mean_acceptance(gen, prompts, max_new_tokens, temperature=0.0):
    stats = AcceptanceStats(gen.config.depth)
    for i, p in enumerate(prompts):
        stats.merge(gen.generate([p], max_new_tokens, SamplingParams.uniform(1, temperature=temperature),
                                 seed=i).stats)
    return stats.mean_acceptance_length


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_greedy_batch_is_identical_to_transformers(setup, mode):
    target, draft, config, prompts = setup
    config = Eagle3Config.chain(5, layer_ids=config.layer_ids) if mode == "chain" else config
    batch = prompts[:6]
    out = SpeculativeGenerator(target, draft, config).generate(batch, 40, SamplingParams.uniform(len(batch)),
                                                               eos_token_id=1)
    assert out.stats.mean_acceptance_length > 1.5  # paths really get accepted and compacted
    for prompt, got in zip(batch, out.tokens):
        ids = torch.tensor([prompt])
        ref = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False,
                              eos_token_id=1, pad_token_id=2)[0, len(prompt):].tolist()
        assert got == ref


def test_tree_accepts_at_least_1_2x_the_chain_of_the_same_depth(setup):
    target, draft, config, prompts = setup
    tree = config
    chain = Eagle3Config.chain(tree.depth, layer_ids=tree.layer_ids)
    gen = SpeculativeGenerator(target, draft, chain)
    chain_len = mean_acceptance(gen, prompts[:12], 48)
    gen.config = tree
    tree_len = mean_acceptance(gen, prompts[:12], 48)
    assert tree_len >= 1.2 * chain_len, (tree_len, chain_len)


def test_real_probability_tree_sampler_accepts_more_than_one_hot_at_t1(setup):
    target, draft, config, prompts = setup
    gen = SpeculativeGenerator(target, draft, config)
    real = mean_acceptance(gen, prompts[:16], 48, temperature=1.0)
    gen.config = Eagle3Config(**{**config.to_dict(), "tree_sampler": "one_hot"})
    one_hot = mean_acceptance(gen, prompts[:16], 48, temperature=1.0)
    assert real > one_hot, (real, one_hot)
