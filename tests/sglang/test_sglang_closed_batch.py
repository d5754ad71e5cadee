"""The closed-batch rule (``eagle3_plugin/wave.py``) in the real SGLang server with the auto budget: requests that
wait in SGLang's scheduler (``eagle3_plugin/sglang/waiting.py``) will refill the batch, so it is open, even where its
first requests joined an idle server together (tests/vllm/test_vllm_closed_batch.py has both cases for vLLM)."""

import json

from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET, hf_greedy
from eagle3_plugin.budget_log import LOG_ENV
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from sglang_env import our_tree_args, server

SLOTS = 4
GREEDY = {"max_new_tokens": 48, "temperature": 0.0, "ignore_eos": True}


def test_a_batch_the_schedulers_queue_refills_is_open(tmp_path, monkeypatch):
    """Twelve prompts in one request through four slots: the first four start together on an idle server, and eight
    wait. The budget's log (a line at every change of shape or of whether the batch is closed) reads no step of a
    full batch as closed while requests wait; greedy outputs stay transformers'. Eight requests must end before the
    queue empties, four at a time, each after at least 48 / 6 steps (a tree of depth 5 emits at most 6 tokens a step):
    the first 16 steps see requests waiting. The last four, once nothing waits, are a closed batch."""
    tok = AutoTokenizer.from_pretrained(TARGET)
    prompts = [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:12]]
    log = tmp_path / "budget.jsonl"
    monkeypatch.setenv(LOG_ENV, str(log))
    args = our_tree_args(DRAFT) + ["--max-running-requests", str(SLOTS)]
    with server(TARGET, args, str(tmp_path / "server.log")) as s:
        out = s.generate(prompts, GREEDY)
    lines = list(map(json.loads, log.read_text().splitlines()))
    queued = [line for line in lines if line["step"] <= 2 * (48 // 6)]  # a line at each change: closed shows here
    assert queued and not any(line["closed"] for line in queued), lines
    assert [o["output_ids"] for o in out] == hf_greedy(prompts, GREEDY["max_new_tokens"])
