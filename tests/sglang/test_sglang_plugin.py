"""eagle3-plugin inside the real SGLang server (CPU, fp32, tree 3/4/10 from the bundled draft in our layout).

- T > 0: the first four generated tokens have the target's exact joint law, at T = 1, at T = 1 with min-p, and in a
  batch that mixes greedy, T = 1 and top-k + top-p rows (tests/law_cases.py), top-k, top-p and min-p filtered
  jointly as SGLang's own sampler does (it draws each request's first token); our joint filter keeps what SGLang's
  keeps. Stock SGLang
  verifies greedily on CPU whatever the temperature (``eagle_utils._verify_uses_greedy``) and fails the T = 1 test.
- 20 concurrent requests, greedy and T = 1 mixed, all complete; the greedy ones equal plain greedy decoding.
- A seeded request repeats its output whatever is served beside it or before it, its first token included (SGLang
  draws that from its shared generator; our hook redraws it from the request's own).
- Logprobs of the accepted tokens come back (SGLang computes them from the target's verify logits).
- Penalties (frequency, presence, repetition), ``min_new_tokens``, ``logit_bias`` and grammars (a regex, a JSON
  schema, EBNF), alone and mixed: greedy outputs equal SGLang's without speculation, with its overlap scheduler off
  (SGLang turns it off for speculation on CPU; with it on, its penalties read the output one token late), and each
  setting changes them. At T = 1 they are served, ``min_new_tokens`` holds the stop ids back and outputs match
  their regex. Our per-node rules equal SGLang's own penalizers bit for bit (tests/sglang_support/same_penalties.py).
- Settings our verifier would ignore are refused at admission (HTTP 400), and the server keeps serving; extreme
  values SGLang's own checks let through are served, but for those that would stop it (prompt or stop ids outside
  the vocabulary, more top logprobs than it has): refused too.
- An unsupported SGLang version stops the plugin with one clear error.
"""

import json
import os
import re
import subprocess
import urllib.error
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.convert import convert
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.sglang.server import post_json
from sglang_env import SGLANG_PYTHON, STOCK_PLUGINS, SUPPORT, server
from law_cases import ALPHA, GROUPS, LENGTH, N, group_prompts, group_pvalue, mixed_order, mixed_pvalues
from stats_util import path_law

SAME_PENALTIES = os.path.join(SUPPORT, "same_penalties.py")
GRAMMAR_DRAFTS = os.path.join(SUPPORT, "grammar_drafts.py")
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "10"]
STOP = 376  # a token the bundled target's greedy outputs hold early
SCHEMA = json.dumps({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                     "required": ["name", "age"]})
RULES = [{"frequency_penalty": 0.6}, {"presence_penalty": 0.8}, {"repetition_penalty": 1.3},
         {"min_new_tokens": 30, "stop_token_ids": [STOP]},
         {"frequency_penalty": 1.5, "presence_penalty": -0.3, "min_new_tokens": 12},
         {"logit_bias": {str(STOP): -100.0, "14": 1.5}, "frequency_penalty": 0.4},
         {"regex": "(yes|no), because [a-z ]+\\."}, {"json_schema": SCHEMA, "presence_penalty": 0.5},
         {"ebnf": 'root ::= ("yes" | "no") ", since " [a-z]+ (" " [a-z]+)* "."'}]


@pytest.fixture(scope="module")
def prompts():
    tok = AutoTokenizer.from_pretrained(TARGET)
    return [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:20]]


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    args = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", DRAFT, *TREE]
    with server(TARGET, args, str(tmp_path_factory.mktemp("sgl") / "ours.log")) as s:
        yield s


def greedy(srv, prompts: list, settings: dict) -> list:
    out = srv.generate(prompts, [{"max_new_tokens": 40, "temperature": 0, **settings}] * len(prompts), timeout=1200)
    return [o["output_ids"] for o in out]


@pytest.fixture(scope="module")
def plain_with_rules(prompts, tmp_path_factory):
    """SGLang without speculation and without its overlap scheduler: greedy outputs of 6 prompts, plain then with each
    of :data:`RULES` (the server is down before ours starts: an idle SGLang server still takes CPU). No setting mixes
    the repetition penalty with the others: there this SGLang applies its penalizers in a Python set's order, which
    differs between processes (``BatchedPenalizerOrchestrator.apply``); with speculation, and with the overlap
    scheduler, it adds the others first, as ours does."""
    log = str(tmp_path_factory.mktemp("sgl") / "plain.log")
    with server(TARGET, ["--disable-overlap-schedule"], log, plugins=STOCK_PLUGINS) as plain:
        return [greedy(plain, prompts[:6], rules) for rules in [{}, *RULES]]


@pytest.fixture(scope="module")
def law_prompts():
    return group_prompts()


def sample(srv, prompts: list, settings: list) -> list:
    """The first four generated tokens of each request, sent as one batch with its own settings per row."""
    out = srv.generate(prompts, [{**row, "max_new_tokens": LENGTH, "ignore_eos": True} for row in settings],
                       timeout=1200)
    assert sum(o["meta_info"].get("spec_verify_ct", 0) for o in out) >= len(prompts)  # every request verified
    return [o["output_ids"] for o in out]


def test_stock_sglang_cpu_fails_the_sampling_test(law_prompts, tmp_path):
    # first in the module: an idle SGLang server still takes CPU, so ours is not up yet
    draft = str(tmp_path / "draft-sglang")  # stock SGLang reads capture ids only from its own layout
    convert(DRAFT, "sglang", draft, target=TARGET)
    args = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft, *TREE]
    with server(TARGET, args, str(tmp_path / "stock.log"), plugins=STOCK_PLUGINS) as stock:
        generations = sample(stock, [law_prompts["T=1"]] * 1000, [GROUPS["T=1"][1]] * 1000)
    assert group_pvalue(law_prompts, "T=1", generations) < 1e-6


def test_greedy_with_output_rules_and_grammars_equals_sglang_without_speculation(plain_with_rules, ours, prompts):
    unruled, *ruled = plain_with_rules
    assert greedy(ours, prompts[:6], {}) == unruled
    for rules, theirs in zip(RULES, ruled):
        assert theirs != unruled, rules  # the setting changes the target's output
        assert greedy(ours, prompts[:6], rules) == theirs, rules


def test_grammar_constrained_requests_are_valid_at_temperature_1(ours, prompts):
    outs = ours.generate(prompts[:6], [{"max_new_tokens": 40, "temperature": 1.0, "regex": "[a-z]+( [a-z]+)*",
                                        "ignore_eos": True}] * 6, timeout=1200)
    assert all(re.fullmatch("[a-z]+( [a-z]+)*", o["text"]) for o in outs), [o["text"] for o in outs]


def test_penalties_and_min_new_tokens_at_temperature_1_are_served(ours, prompts):
    stops = sorted({t for out in greedy(ours, prompts[:6], {}) for t in out[:4]})  # ids a sampled output meets early
    settings = {"temperature": 1.0, "sampling_seed": 7, "max_new_tokens": 40, "min_new_tokens": 20,
                "stop_token_ids": stops, "frequency_penalty": 0.5, "presence_penalty": 0.5, "repetition_penalty": 1.1}
    outs = [o["output_ids"] for o in ours.generate(prompts[:8], [settings] * 8, timeout=1200)]
    assert all(len(out) >= 20 and not set(out[:20]) & set(stops) for out in outs), outs
    unheld = [o["output_ids"] for o in ours.generate(prompts[:8], [{**settings, "min_new_tokens": 0}] * 8)]
    assert min(len(out) for out in unheld) < 20  # without the minimum, those stop ids end some outputs early


def test_a_seeded_request_gives_the_same_output_alone_and_among_others(ours, prompts):
    """Its draws come from its own generator, for its own tree's nodes only: greedy requests beside it, whose
    accepted paths go deeper, change nothing."""
    seeded = {"temperature": 1.0, "sampling_seed": 11, "max_new_tokens": 32, "ignore_eos": True}
    alone = ours.generate(prompts[0], seeded)["output_ids"]
    others = [{"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}] * 5
    among = ours.generate(prompts[:6], [seeded] + others, timeout=1200)[0]["output_ids"]
    assert among == alone


def test_seeded_requests_repeat_their_first_tokens_whatever_was_sampled_before(ours, prompts):
    """SGLang draws a prompt's first token from its shared generator; ours redraws a seeded request's from its own,
    and SGLang's logprobs read that token. Without the redraw, a sampled batch in between changes first tokens."""
    seeded = [{"temperature": 1.0, "sampling_seed": 11 + i, "max_new_tokens": 3, "ignore_eos": True} for i in range(8)]
    unseeded = [{"temperature": 1.0, "max_new_tokens": 3, "ignore_eos": True}] * 8
    runs = []
    for _ in range(2):
        runs.append(post_json(ours.url + "/generate", {"input_ids": prompts[:8], "sampling_params": seeded,
                                                       "return_logprob": True}, 600))
        ours.generate(prompts[8:16], unseeded)
    first, again = ([o["output_ids"] for o in run] for run in runs)
    assert first == again
    logprobs = [[t[:2] for t in o["meta_info"]["output_token_logprobs"]] for o in runs[0]]
    assert [[token for _, token in row] for row in logprobs] == first
    assert logprobs == [[t[:2] for t in o["meta_info"]["output_token_logprobs"]] for o in runs[1]]


ODD_SETTINGS = [  # extremes SGLang's own checks let through, at T = 1 (a NaN in our sampler would stop the server)
    {"logit_bias": {"5": 1e30}}, {"logit_bias": {str(i): -1e30 for i in range(2048)}},
    {"repetition_penalty": 1e-6, "frequency_penalty": -2.0}, {"min_p": 1.0},
    {"min_new_tokens": 10, "stop_token_ids": list(range(2048))}]


def test_odd_settings_are_served_and_the_server_keeps_serving(ours, prompts):
    for settings in ODD_SETTINGS:
        out = ours.generate(prompts[0], {"max_new_tokens": 16, "temperature": 1.0, **settings})
        assert len(out["output_ids"]) > 0, settings
        assert len(ours.generate(prompts[1], {"max_new_tokens": 8, "temperature": 0})["output_ids"]) == 8
    assert set(ours.generate(prompts[0], {"max_new_tokens": 16, **ODD_SETTINGS[0]})["output_ids"]) == {5}


OUT_OF_RANGE = [  # SGLang 0.5.23 admits these, then its scheduler raises on them and the whole server stops
    {"input_ids": [1, 999999]}, {"input_ids": [5, -3]}, {"return_logprob": True, "top_logprobs_num": 5000},
    {"sampling_params": {"max_new_tokens": 4, "min_new_tokens": 2, "stop_token_ids": [999999]}}]


@pytest.mark.parametrize("request_", OUT_OF_RANGE)
def test_requests_that_would_stop_sglang_are_refused_and_the_server_keeps_serving(ours, prompts, request_):
    body = {"input_ids": prompts[0], "sampling_params": {"max_new_tokens": 4}, **request_}
    with pytest.raises(urllib.error.HTTPError) as e:
        post_json(ours.url + "/generate", body, 60)
    assert e.value.code == 400 and "2048" in e.value.read().decode()
    assert len(ours.generate(prompts[0], {"max_new_tokens": 4})["output_ids"]) == 4


def test_our_rules_at_each_node_equal_sglangs_own_penalizers():
    proc = subprocess.run([SGLANG_PYTHON, SAME_PENALTIES], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "same", proc.stderr[-3000:]


def test_drafts_obey_sglangs_own_grammars_at_every_tree_node():
    """SGLang verifies the whole tree under a request's grammar, so the draft reads the grammar at every node: with
    SGLang's own grammar objects (its xgrammar backend, the bundled tokenizer) every node a grammar row drafts obeys
    it (JSON schema, regex, EBNF), the grammars are left where they stood, and the same draft without them does not
    obey them. At the next step the verify masks our shim builds, reusing what the draft read, equal SGLang's own
    (tests/sglang_support/grammar_drafts.py)."""
    proc = subprocess.run([SGLANG_PYTHON, GRAMMAR_DRAFTS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "obeyed", proc.stderr[-3000:]


def test_four_tokens_at_temperature_1_have_the_target_law(ours, law_prompts):
    generations = sample(ours, [law_prompts["T=1"]] * N, [GROUPS["T=1"][1]] * N)
    assert group_pvalue(law_prompts, "T=1", generations) > ALPHA


def test_four_tokens_with_min_p_have_the_target_law(ours, law_prompts):
    settings = dict(temperature=1.0, min_p=0.05)  # 36 paths above the chi-square's floor without it, 9 with it
    generations = sample(ours, [law_prompts["T=1"]] * N, [settings] * N)
    assert path_law(TARGET, law_prompts["T=1"], LENGTH, joint=True, **settings).pvalue(generations) > ALPHA


def test_a_mixed_batch_gives_each_row_its_own_law(ours, law_prompts):
    order = mixed_order()
    generations = sample(ours, [law_prompts[g] for g in order], [GROUPS[g][1] for g in order])
    pvalues = mixed_pvalues(law_prompts, order, generations, joint=True)  # SGLang's top-k/top-p order
    assert all(p > ALPHA for p in pvalues.values()), pvalues


def test_concurrent_requests_complete_and_greedy_ones_equal_plain_decoding(ours, prompts):
    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    greedy = set(range(0, 20, 2)) | {1, 3}  # 12 greedy, 8 sampled, interleaved

    def send(i):
        params = {"max_new_tokens": 40, "ignore_eos": True, "temperature": 0.0 if i in greedy else 1.0}
        return ours.generate(prompts[i], params)

    with ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(send, range(len(prompts))))
    assert all(len(o["output_ids"]) == 40 for o in outs)
    for i in sorted(greedy):
        with torch.no_grad():
            plain = target.generate(torch.tensor([prompts[i]]), max_new_tokens=40, do_sample=False, eos_token_id=None)
        assert outs[i]["output_ids"] == plain[0, len(prompts[i]):].tolist(), i


def test_logprobs_of_speculated_tokens_are_returned(ours, prompts):
    out = post_json(ours.url + "/generate", {"input_ids": prompts[1], "return_logprob": True,
                                             "sampling_params": {"max_new_tokens": 24, "temperature": 0}})
    logprobs = out["meta_info"]["output_token_logprobs"]  # (logprob, token id, text) per generated token
    assert [entry[1] for entry in logprobs] == out["output_ids"] and len(logprobs) == 24
    assert all(entry[0] <= 0 for entry in logprobs) and out["meta_info"]["spec_verify_ct"] < 24


@pytest.mark.parametrize("setting", [{"watermark": {}}, {"watermark": {"enabled": True}}])
def test_settings_the_verifier_would_ignore_are_refused(ours, prompts, setting):
    with pytest.raises(urllib.error.HTTPError) as e:
        ours.generate(prompts[0], {"max_new_tokens": 4, **setting})
    assert e.value.code == 400 and "eagle3-plugin" in e.value.read().decode()
    assert len(ours.generate(prompts[0], {"max_new_tokens": 4})["output_ids"]) > 0


SAME_FILTER_AS_SGLANG = """
import torch
from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch as sglang_filter
from eagle3_plugin.sampler import SamplingParams, target_probs
g = torch.Generator().manual_seed(0)
for _ in range(200):
    logits = torch.randn(6, 64, generator=g) * 3
    temperature = torch.rand(6, generator=g) + 0.3
    top_k = torch.randint(1, 65, (6,), generator=g)
    top_p = torch.rand(6, generator=g) * 0.9 + 0.05
    min_p = torch.rand(6, generator=g) * 0.3
    top_p[0], top_k[1], min_p[2] = 1.0, 64, 0.0  # a row without top-p, one without top-k, one without min-p
    probs = torch.softmax(logits / temperature[:, None], -1)
    _, kept, order, _ = sglang_filter(probs.clone(), top_k, top_p, min_p, True, None, None, return_filtered_probs=True)
    theirs = torch.zeros_like(probs).scatter(1, order.long(), kept)
    theirs /= theirs.sum(-1, keepdim=True)
    ours = target_probs(logits, SamplingParams(temperature, top_k, top_p, filter_order="joint", min_p=min_p))
    assert torch.equal(theirs > 0, ours > 0), (theirs > 0) ^ (ours > 0)
    assert torch.allclose(theirs, ours, atol=1e-6)
print("same")
"""


def test_our_joint_filter_keeps_what_sglang_keeps():
    proc = subprocess.run([SGLANG_PYTHON, "-c", SAME_FILTER_AS_SGLANG], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "same", proc.stderr[-3000:]


CHAINS_VERIFY_AS_CHAINS = """
import torch
from eagle3_plugin.rng import RowRandom
from eagle3_plugin.sampler import SamplingParams
from eagle3_plugin.sglang.verify import build_verify_input
from eagle3_plugin.tree import DraftTree
nodes = torch.arange(4).expand(2, -1)
chains = DraftTree(nodes + 10, nodes - 1, nodes.clone())
trees = DraftTree(nodes + 10, torch.tensor([[-1, 0, 0, 1]] * 2), torch.tensor([[0, 1, 1, 2]] * 2))
roots = DraftTree.root_only(torch.tensor([3, 4]))
settings = dict(params=SamplingParams.uniform(2), random=RowRandom(torch.Generator(), {}), method="real",
                vocab_size=64, topk=4)
print(*(build_verify_input(t, torch.tensor([5, 7]), **settings).tree_topk for t in (chains, trees, roots)))
"""


def test_a_step_of_chains_is_verified_as_sglang_verifies_a_configured_chain():
    """Under a tree configuration the auto budget drafts chains (or nothing) on most steps: those steps tell SGLang
    topk 1, so its attention skips the tree mask and its verify step the accepted path's compaction."""
    proc = subprocess.run([SGLANG_PYTHON, "-c", CHAINS_VERIFY_AS_CHAINS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1", "4", "1"]


def test_an_unsupported_sglang_version_stops_with_one_clear_error():
    code = ("import sglang; sglang.__version__ = '0.5.22'\n"
            "from eagle3_plugin.sglang.plugin import register\nregister()")
    proc = subprocess.run([SGLANG_PYTHON, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "SGLang 0.5.22 is not supported (supported: 0.5.23)" in proc.stderr
