"""The real OpenAI server (our launcher, our config file: chain and tree) under load: 20 concurrent
streaming requests on 127.0.0.1, bounded in count and time. All complete, greedy ones equal non-speculative decoding,
the speculative counters moved, and the server log has no error while serving (vLLM 0.32's own teardown
can race its output handler and log an EngineDeadError after a clean drain: not counted)."""

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from transformers import AutoModelForCausalLM, AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.openai_api import spec_counters, stream_completion
from eagle3_plugin.vllm.server import running_server

GREEDY, SAMPLED, MAX_TOKENS = 16, 4, 32


CONFIGS = {"chain": {"mode": "chain", "depth": 4}, "tree": {"mode": "tree", "depth": 5, "top_k": 8, "total_tokens": 32}}


@pytest.mark.parametrize("mode", sorted(CONFIGS))
def test_concurrent_streaming_requests_with_speculation(tmp_path, mode):
    config = tmp_path / "eagle3.json"
    config.write_text(json.dumps({"draft": DRAFT, "layer_ids": [1, 3, 5], **CONFIGS[mode]}))
    prompts = [r.prompt for r in read_prompts(HELDOUT)[:GREEDY]]
    log = str(tmp_path / "server.log")
    with running_server(TARGET, ["--speculative-config", str(config), "--dtype", "float32",
                                 "--max-model-len", "1024", "--enforce-eager"], log) as url:
        jobs = [(p, 0.0) for p in prompts] + [(p, 1.0) for p in prompts[:SAMPLED]]
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            results = list(pool.map(lambda job: stream_completion(url, TARGET, job[0], MAX_TOKENS,
                                                                  temperature=job[1], timeout=300), jobs))
        counters = spec_counters(url)
    assert all(r.tokens == MAX_TOKENS for r in results)
    assert counters.num_drafts > 0 and counters.num_accepted_tokens > 0

    tok = AutoTokenizer.from_pretrained(TARGET)
    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype="float32").eval()
    for prompt, result in zip(prompts, results[:GREEDY]):
        ids = encode_prompt(tok, prompt)
        out = target.generate(input_ids=torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                              pad_token_id=2, eos_token_id=None)[0, len(ids):]
        assert result.text == tok.decode(out, skip_special_tokens=True)
    with open(log) as f:
        serving = f.read().split("[shutdown]")[0]  # vLLM 0.32's AsyncLLM may log EngineDeadError while it stops
    bad = [line for line in serving.splitlines() if " ERROR " in line or "Traceback" in line]
    assert not bad, bad[:5]
    assert os.path.getsize(log) > 0
