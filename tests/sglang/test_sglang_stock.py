"""The real SGLang 0.5.23 server on this CPU (``.venv-sglang`` + tests/sglang_support) with our draft converted
by ``eagle3 convert --to sglang``: stock EAGLE-3 chain and tree give greedy outputs identical to SGLang
without speculation, which equal the core's reference generator; the chain accepts exactly what the
reference accepts, round by round. (Stock SGLang's tree drafting attends to slot positions, not true
ancestors, for top_k > 1, so its tree acceptance may differ slightly from the reference's: reported, and
required to beat the chain.)"""

import json
import os
import subprocess

import pytest
from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, ROOT, TARGET
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.reference import AcceptanceStats, SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams

SGLANG_PYTHON = os.path.join(ROOT, ".venv-sglang", "bin", "python")
COMPARE = os.path.join(ROOT, "tests", "sglang_support", "compare_greedy.py")
MAX_NEW_TOKENS = 48


@pytest.fixture(scope="module")
def prompts():
    tok = AutoTokenizer.from_pretrained(TARGET)
    return [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:8]]


@pytest.fixture(scope="module")
def report(prompts, tmp_path_factory):
    assert os.path.exists(SGLANG_PYTHON), "no .venv-sglang: run bash ci/setup.sh"
    tmp = tmp_path_factory.mktemp("sglang")
    (tmp / "ids.json").write_text(json.dumps(prompts))
    proc = subprocess.run([SGLANG_PYTHON, COMPARE, "--prompt-ids", str(tmp / "ids.json"), "--max-new-tokens",
                           str(MAX_NEW_TOKENS), "--log-dir", str(tmp), "--out", str(tmp / "report.json")],
                          capture_output=True, text=True, timeout=1200)
    assert (tmp / "report.json").exists(), proc.stderr[-4000:]
    return json.loads((tmp / "report.json").read_text())


def reference(config, prompts):
    gen = SpeculativeGenerator.from_pretrained(TARGET, config)
    stats, tokens = AcceptanceStats(config.depth), []
    for p in prompts:
        out = gen.generate([p], MAX_NEW_TOKENS, SamplingParams.uniform(1))
        stats.merge(out.stats)
        tokens.append(out.tokens[0])
    return stats, tokens


def test_stock_sglang_greedy_chain_and_tree_are_identical_and_match_the_reference(report, prompts):
    chain_stats, ref_tokens = reference(Eagle3Config.chain(5, draft=DRAFT), prompts)
    assert report["none"]["outputs"] == ref_tokens
    assert report["chain"]["identical_to_reference"] and report["tree"]["identical_to_reference"]
    assert report["chain"]["verify_rounds"] == chain_stats.rounds
    assert report["chain"]["accepted_drafts"] == chain_stats.accepted_tokens
    assert report["tree"]["mean_acceptance_length"] > 1.15 * report["chain"]["mean_acceptance_length"]
