"""SGLang's radix cache and retraction with our worker (the draft's KV lives in SGLang's draft pool).

- Radix cache on (SGLang's default): requests sharing a 200-token prefix reuse it (SGLang's ``cached_tokens``
  rise), their greedy outputs equal transformers' greedy decoding, and our tree (fixed budget) accepts exactly
  what it accepts with the radix cache off.
- A seeded request at T = 1 whose prompt is prefilled in chunks, then again from the radix cache, gives the same
  output both times.
- Retraction: a token pool too small for every request at once makes SGLang retract requests and run them
  again later; greedy outputs stay identical, with the auto budget (steps that draft nothing defer their draft
  entries, which must land before a retracted request's slots change owner).
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET, hf_greedy, shared_prefix_prompts
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from sglang_env import fixed_budget_config, our_tree_args, server

MAX_TOKENS = 48
GREEDY = {"max_new_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TARGET)


def test_radix_cache_reuses_the_drafts_kv(tokenizer, tmp_path):
    prompts = shared_prefix_prompts(tokenizer)
    runs = {}
    fixed = fixed_budget_config(DRAFT, str(tmp_path / "eagle3.json"))
    for cached in (True, False):
        args = our_tree_args(fixed) + ([] if cached else ["--disable-radix-cache"])
        with server(TARGET, args, str(tmp_path / f"radix-{cached}.log")) as s:
            first = s.generate(prompts[0], GREEDY)  # fills the cache
            runs[cached] = [first] + s.generate(prompts[1:], GREEDY)
    on, off = runs[True], runs[False]
    assert all(o["meta_info"]["cached_tokens"] >= 190 for o in on[1:])
    assert all(o["meta_info"]["cached_tokens"] == 0 for o in off)
    assert [o["output_ids"] for o in on] == hf_greedy(prompts, MAX_TOKENS) == [o["output_ids"] for o in off]
    for key in ("spec_verify_ct", "spec_num_correct_drafts"):
        assert [o["meta_info"][key] for o in on] == [o["meta_info"][key] for o in off], key


def test_a_seeded_request_repeats_whether_its_prompt_was_chunked_or_cached(tokenizer, tmp_path):
    """A 700-token prompt prefilled in 128-token chunks, then from the radix cache in one: each chunk's tree is drafted
    and thrown away, so its draws must not come from the request's generator."""
    prompt = sum((encode_prompt(tokenizer, r.prompt) for r in read_prompts(HELDOUT)[:8]), [])[:700]
    seeded = {"temperature": 1.0, "sampling_seed": 3, "max_new_tokens": 16, "ignore_eos": True}
    with server(TARGET, our_tree_args(DRAFT) + ["--chunked-prefill-size", "128"], str(tmp_path / "chunks.log")) as s:
        chunked, cached = s.generate(prompt, seeded), s.generate(prompt, seeded)
    assert cached["meta_info"]["cached_tokens"] >= 600
    assert chunked["output_ids"] == cached["output_ids"]


def test_retraction_keeps_outputs(tokenizer, tmp_path):
    prompts = [encode_prompt(tokenizer, r.prompt) for r in read_prompts(HELDOUT)[:12]]
    log = tmp_path / "retract.log"
    with server(TARGET, our_tree_args(DRAFT) + ["--max-total-tokens", "700"], str(log)) as s:
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            out = list(pool.map(lambda p: s.generate(p, GREEDY), prompts))
    assert "KV cache pool is full. Retract requests" in log.read_text()  # SGLang logs each retraction
    assert [o["output_ids"] for o in out] == hf_greedy(prompts, MAX_TOKENS)
