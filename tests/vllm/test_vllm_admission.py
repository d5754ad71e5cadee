"""What a client may ask of our served tree worker, through the ``openai`` client against the real server: settings the
worker honours come back right (logprobs of the emitted tokens, of the prompt tokens and of ids a request names equal
the target's own log-probabilities; n, stop, seed, echo, beam search, any top_k, penalties, min_tokens, allowed ids,
bad words, logit_bias, min_p and grammars are served), settings it cannot honour get HTTP 400, streams the client
drops mid-way end cleanly, and every later request is still served, unchanged."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.vllm.server import running_server

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    work = tmp_path_factory.mktemp("admission")
    config = work / "eagle3.json"
    config.write_text(json.dumps({"draft": DRAFT, "layer_ids": [1, 3, 5], "mode": "tree", "depth": 5, "top_k": 8,
                                  "total_tokens": 32}))
    args = ["--speculative-config", str(config), "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager"]
    with running_server(TARGET, args, str(work / "server.log")) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def prompt():
    return read_prompts(HELDOUT)[0].prompt


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TARGET)


@pytest.fixture(scope="module")
def target():
    return AutoModelForCausalLM.from_pretrained(TARGET, dtype="float32").eval()


def complete(client, prompt, temperature=0.0, **kw):
    return client.completions.create(model=TARGET, prompt=prompt, max_tokens=MAX_TOKENS, temperature=temperature, **kw)


@pytest.fixture(scope="module")
def greedy(prompt, tok, target):
    """The target's greedy tokens after ``prompt`` and the log-probabilities ``[MAX_TOKENS, V]`` each came from."""
    ids = encode_prompt(tok, prompt)
    with torch.no_grad():
        gen = target.generate(input_ids=torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                              pad_token_id=2, eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    return gen.sequences[0, len(ids):], torch.log_softmax(torch.cat(gen.logits).float(), dim=-1)


def test_logprobs_are_the_targets(client, prompt, tok, greedy):
    out = complete(client, prompt, logprobs=3).choices[0]
    new, want = greedy
    assert out.text == tok.decode(new, skip_special_tokens=True)
    got = out.logprobs.token_logprobs
    assert len(got) == MAX_TOKENS  # one per emitted token, accepted drafts and bonus tokens alike
    assert got == pytest.approx(want[torch.arange(MAX_TOKENS), new].tolist(), abs=1e-3)
    for position, top in enumerate(out.logprobs.top_logprobs):
        assert len(top) >= 3
        best = sorted(top.values(), reverse=True)[:3]
        assert best == pytest.approx(want[position].topk(3).values.tolist(), abs=1e-3)


def test_logprob_token_ids_are_the_targets(client, prompt, tok, greedy):
    """The named ids' log-probabilities at every emitted token (vLLM's generative scoring reads them), not the top
    ones: the named ids are among the least likely."""
    new, want = greedy
    named = want[0].argsort()[:3].tolist()
    out = complete(client, prompt, logprobs=1, extra_body={"logprob_token_ids": named}).choices[0]
    assert out.text == tok.decode(new, skip_special_tokens=True)
    assert len(out.logprobs.top_logprobs) == MAX_TOKENS
    for position, top in enumerate(out.logprobs.top_logprobs):
        assert len(top) <= len(named) + 1
        for token in named + [int(new[position])]:
            assert any(abs(v - float(want[position, token])) < 1e-3 for v in top.values()), (position, token)


def test_generative_scoring_is_the_targets(client, prompt, tok, target):
    """vLLM's ``/generative_scoring`` (a first token's probability of a label id, through ``logprob_token_ids``)."""
    query, items, label = encode_prompt(tok, prompt), [[17, 18], [40]], 5
    answer = httpx.post(str(client.base_url).removesuffix("/v1/") + "/generative_scoring", timeout=120,
                        json={"model": TARGET, "query": query, "items": items, "label_token_ids": [label, 6],
                              "apply_softmax": False})
    assert answer.status_code == 200, answer.text
    with torch.no_grad():
        want = [torch.softmax(target(torch.tensor([query + item])).logits[0, -1].float(), -1)[label] for item in items]
    assert [d["score"] for d in answer.json()["data"]] == pytest.approx([float(p) for p in want], abs=1e-4)


REFUSED = {  # vLLM refuses it first here (no reasoning parser); with one, ours would
    "thinking_token_budget": dict(extra_body={"thinking_token_budget": 8}),
}


@pytest.mark.parametrize("setting", sorted(REFUSED))
def test_unsupported_settings_get_400_and_the_server_keeps_serving(client, prompt, setting):
    refused = "not (yet )?supported|not configured|does not support"  # ours or vLLM's
    with pytest.raises(openai.BadRequestError, match=refused):
        complete(client, prompt, **REFUSED[setting])
    assert complete(client, prompt).usage.completion_tokens == MAX_TOKENS


HONOURED = {  # their effect on the tokens is tested against vLLM without speculation (test_vllm_output_rules)
    "penalties": dict(presence_penalty=0.5, frequency_penalty=0.5, extra_body={"repetition_penalty": 1.2}),
    "min_tokens": dict(extra_body={"min_tokens": 4}),
    "allowed_token_ids": dict(extra_body={"allowed_token_ids": [5, 6, 7]}),
    "bad_words": dict(extra_body={"bad_words": ["def"]}),
    "logit_bias": dict(logit_bias={"17": 5, "18": -100}),
    "logit_bias on every id": dict(logit_bias={str(t): -100 for t in range(2048)}),
    "min_p": dict(extra_body={"min_p": 0.1}),
    "min_p 1 with a bias": dict(logit_bias={"17": 100}, extra_body={"min_p": 1.0}),
    "a regex": dict(extra_body={"structured_outputs": {"regex": "[a-z]+( [a-z]+)*"}}),
    "a JSON schema": dict(extra_body={"structured_outputs": {"json": {"type": "object"}}}),
    # vLLM compiles it with guidance; the worker's xgrammar copy, for the draft, ignores multipleOf
    "a JSON schema vLLM gives to guidance": dict(extra_body={"structured_outputs": {"json": {
        "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}}}),
}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("setting", sorted(HONOURED))
def test_output_rules_are_served_and_the_server_keeps_serving(client, prompt, setting, temperature):
    out = complete(client, prompt, temperature, **HONOURED[setting]).choices[0]
    assert out.finish_reason in ("length", "stop") and out.text
    if setting == "allowed_token_ids":
        assert out.text.strip(AutoTokenizer.from_pretrained(TARGET).decode([5, 6, 7])) == ""
    assert complete(client, prompt).usage.completion_tokens == MAX_TOKENS


def test_n_stop_and_seed(client, prompt):
    plain = complete(client, prompt).choices[0].text
    # vLLM allows n > 1 only when sampling; at T=1 the end-of-sequence token may be drawn, so it is ignored here
    two = complete(client, prompt, n=2, temperature=1.0, extra_body={"ignore_eos": True})
    assert len(two.choices) == 2 and all(c.finish_reason == "length" for c in two.choices)
    assert two.usage.completion_tokens == 2 * MAX_TOKENS
    cut = plain[5:9]
    stopped = complete(client, prompt, stop=[cut]).choices[0]
    assert stopped.finish_reason == "stop" and plain.startswith(stopped.text) and cut not in stopped.text
    seeded = [complete(client, prompt, temperature=1.0, seed=7).choices[0].text for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_prompt_logprobs_are_the_targets(client, prompt, tok, target):
    ids = encode_prompt(tok, prompt)
    out = complete(client, ids, extra_body={"prompt_logprobs": 2}).choices[0]
    given = out.model_extra["prompt_logprobs"]
    with torch.no_grad():
        want = torch.log_softmax(target(torch.tensor([ids])).logits[0].float(), dim=-1)
    assert len(given) == len(ids) and given[0] is None  # nothing predicts the first token
    got = [given[i][str(ids[i])]["logprob"] for i in range(1, len(ids))]
    assert got == pytest.approx(want[torch.arange(len(ids) - 1), ids[1:]].tolist(), abs=1e-3)


def test_echo_beam_search_and_any_top_k(client, prompt):
    plain = complete(client, prompt).choices[0].text
    assert complete(client, prompt, echo=True).choices[0].text == prompt + plain
    beams = complete(client, prompt, n=2, extra_body={"use_beam_search": True})
    assert len(beams.choices) == 2 and all(c.text for c in beams.choices)
    for top_k in (-1, 1, 5000):  # off, greedy in effect, more than the vocabulary
        out = complete(client, prompt, temperature=1.0, extra_body={"top_k": top_k, "ignore_eos": True})
        assert out.usage.completion_tokens == MAX_TOKENS
    assert complete(client, prompt).choices[0].text == plain


def test_streams_dropped_mid_way_leave_the_server_serving_right(client, prompt):
    plain = complete(client, prompt).choices[0].text

    def dropped(i):
        stream = client.completions.create(model=TARGET, prompt=prompt, max_tokens=200, stream=True,
                                           temperature=1.0 if i % 2 else 0.0, extra_body={"ignore_eos": True})
        for chunk_index, _ in enumerate(stream):
            if chunk_index == 2 + i % 5:
                stream.response.close()  # the client goes away; vLLM aborts the request
                return chunk_index
        return None

    with ThreadPoolExecutor(8) as pool:
        assert all(n is not None for n in pool.map(dropped, range(8)))
    assert complete(client, prompt).choices[0].text == plain
