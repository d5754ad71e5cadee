"""The real SGLang 0.5.23 server on this CPU (``.venv-sglang`` + tests/sglang_support), greedy, 8 prompts x 48
tokens, one ``compare_greedy.py`` run: no speculation, stock EAGLE-3's chain (eagle3-plugin left out) and EAGLE-3
with eagle3-plugin, chain 5 and tree 5/8/32 (fixed budget), and the bundled ``eagle3.json`` alone (auto budget).

- Every setting's outputs equal SGLang without speculation, which equal the core's reference generator.
- With eagle3-plugin and the fixed budget, chain and tree accept exactly what the reference generator accepts
  (same verify rounds, same accepted drafts). Our tree reads our layout and the bundled ``eagle3.json``'s tree
  shape, our chain the draft converted to SGLang's layout.
- The auto budget (the default) drafts the tree, its chain and nothing in turn as it measures them (steps
  verifying 32, 6 and 1 tokens), and its outputs stay identical.
- Stock SGLang's chain, on the draft converted to SGLang's layout, matches the reference too. (Stock SGLang's tree
  is left out: it would test SGLang, not us; ``benchmarks/sglang_speculation.py`` still measures it.)
"""

import json
import os
import subprocess

import pytest
from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.reference import AcceptanceStats, SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams
from sglang_env import COMPARE, SGLANG_PYTHON

MAX_NEW_TOKENS = 48
SETTINGS = ("none", "stock-chain", "chain", "tree", "auto")


@pytest.fixture(scope="module")
def prompts():
    tok = AutoTokenizer.from_pretrained(TARGET)
    return [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:8]]


@pytest.fixture(scope="module")
def report(prompts, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sglang")
    (tmp / "ids.json").write_text(json.dumps(prompts))
    proc = subprocess.run([SGLANG_PYTHON, COMPARE, "--prompt-ids", str(tmp / "ids.json"), "--max-new-tokens",
                           str(MAX_NEW_TOKENS), "--settings", ",".join(SETTINGS), "--log-dir", str(tmp),
                           "--out", str(tmp / "report.json")],
                          capture_output=True, text=True, timeout=1500)
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


@pytest.fixture(scope="module")
def chain_reference(prompts):
    return reference(Eagle3Config.chain(5, draft=DRAFT), prompts)


@pytest.fixture(scope="module")
def tree_reference(prompts):
    return reference(Eagle3Config.load(os.path.join(DRAFT, "eagle3.json")), prompts)


def test_every_setting_is_identical_to_sglang_without_speculation_and_to_the_reference(report, chain_reference):
    assert report["none"]["outputs"] == chain_reference[1]
    for name in SETTINGS[1:]:
        assert report[name]["identical_to_reference"], name


def test_the_auto_budget_switches_shapes_and_the_fixed_one_does_not(report):
    auto, tree = report["auto"]["worker_timings"], report["tree"]["worker_timings"]
    assert auto["chain_steps"] > 0 and auto["none_steps"] > 0
    assert auto["chain_steps"] + auto["none_steps"] < auto["steps"]
    assert tree["chain_steps"] == tree["none_steps"] == 0 and tree["steps"] > 0


@pytest.mark.parametrize("name", ["chain", "tree"])
def test_with_the_plugin_acceptance_equals_the_reference_generator(report, name, chain_reference, tree_reference):
    stats = (chain_reference if name == "chain" else tree_reference)[0]
    assert (report[name]["verify_rounds"], report[name]["accepted_drafts"]) == (stats.rounds, stats.accepted_tokens)


def test_stock_sglang_chain_on_the_converted_draft_matches_the_reference(report, chain_reference):
    stats = chain_reference[0]
    assert (report["stock-chain"]["verify_rounds"], report["stock-chain"]["accepted_drafts"]) == (
        stats.rounds, stats.accepted_tokens)
