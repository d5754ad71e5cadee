"""``vllm serve MODEL --speculative-config eagle3.json``, exactly as written, through vLLM's own ``vllm`` script
(``vllm.entrypoints.cli.main``): the served model speculates with our tree (greedy outputs identical to
transformers', acceptance from ``/metrics`` equal to the reference generator's); with ``EAGLE3_VLLM_CLI=0`` the
path gets vLLM's own error; and the start-up hook costs Python start-up nothing but its own few lines."""

import json
import os
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import pytest

from bundled import BASELINES, BENCH_ARGS, DRAFT, HELDOUT, TARGET
from eagle3_plugin.cli import main
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.openai_api import spec_counters, stream_completion
from eagle3_plugin.reference import AcceptanceStats, SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams
from eagle3_plugin.vllm.server import running_server

MAX_TOKENS = 48
VLLM = os.path.join(os.path.dirname(sys.executable), "vllm")


def config_file(tmp_path) -> str:
    """A fixed-budget tree config whose draft path is relative to the file's folder."""
    path = tmp_path / "configs" / "eagle3.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"draft": os.path.relpath(DRAFT, path.parent), "layer_ids": [1, 3, 5], "mode": "tree",
                                "depth": 5, "top_k": 8, "total_tokens": 32, "budget": "fixed"}))
    return str(path)


def test_vllm_serve_with_our_config_file(tmp_path):
    tok = AutoTokenizer.from_pretrained(TARGET)
    prompts = [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:6]]
    config = config_file(tmp_path)
    args = ["--speculative-config", config, "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager"]
    with running_server(TARGET, args, str(tmp_path / "server.log")) as url:
        assert open(tmp_path / "server.log").readline().split()[:2] == [VLLM, "serve"]
        texts = [stream_completion(url, TARGET, p, MAX_TOKENS).text for p in prompts]
        counters = spec_counters(url)
        served = _bench_served(tmp_path, url, "--draft", DRAFT)
    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype="float32").eval()
    gen = SpeculativeGenerator(target, _draft(), Eagle3Config.load(config))
    ref = AcceptanceStats(5)
    for ids, text in zip(prompts, texts):
        want = target.generate(input_ids=torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                pad_token_id=2, eos_token_id=None)[0, len(ids):]
        assert text == tok.decode(want, skip_special_tokens=True)
        ref.merge(gen.generate([ids], MAX_TOKENS, SamplingParams.uniform(1)).stats)
    assert counters.num_drafts == ref.rounds and counters.num_accepted_tokens == ref.accepted_tokens
    # the served bench reads the same acceptance from /metrics as `eagle3 bench --engine vllm` (committed baseline)
    engine = json.load(open(os.path.join(BASELINES, "vllm-tree.json")))
    assert served["engine"] == "openai" and served["levels"][0]["latency"]["ttft_ms"]["p50"] > 0
    for key in ("drafting_rounds", "mean_acceptance_length", "acceptance_per_position", "generated_tokens"):
        assert served[key] == pytest.approx(engine[key], abs=1e-12), key


def _bench_served(tmp_path, url, *extra) -> dict:
    out = tmp_path / "served.json"
    assert main(["bench", "--engine", "openai", "--url", url, *BENCH_ARGS, *extra, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_bench_measures_stock_vllm_native_eagle3(tmp_path):
    """Stock vLLM's own EAGLE-3 chain (vLLM's JSON, inline) through the OpenAI API: acceptance from its
    ``/metrics``, equal to the reference generator's chain of the same depth."""
    native = json.dumps({"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3})
    common = ["--dtype", "float32", "--max-model-len", "1024", "--enforce-eager"]
    with running_server(TARGET, [*common, "--speculative-config", native], str(tmp_path / "native.log")) as url:
        served = _bench_served(tmp_path, url)
    ref_path = tmp_path / "reference.json"
    assert main(["bench", "--engine", "reference", "--draft", DRAFT, "--chain", "3", *BENCH_ARGS,
                 "--json", str(ref_path)]) == 0
    ref = json.loads(ref_path.read_text())
    assert served["mode"] == "served" and served["settings"]["depth"] == 3
    assert served["drafting_rounds"] == ref["drafting_rounds"]
    assert served["acceptance_per_position"] == pytest.approx(ref["acceptance_per_position"], abs=1e-12)


def _draft():
    from eagle3_plugin.checkpoint import load_draft
    return load_draft(DRAFT)


def test_switched_off_the_path_gets_vllms_own_error(tmp_path):
    env = dict(os.environ, EAGLE3_VLLM_CLI="0")
    run = subprocess.run([VLLM, "serve", TARGET, "--speculative-config", config_file(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "argument --speculative-config/-sc: Value " in run.stderr
    assert "cannot be converted to <function loads" in run.stderr  # vLLM's json.loads, untouched


def test_start_up_hook_costs_only_its_own_lines():
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True)
    ours = [line.split("|")[-1].strip() for line in run.stderr.splitlines() if "eagle3" in line]
    assert "eagle3_plugin.vllm.cli" in ours  # the hook is installed
    assert {name for name in ours if not name.startswith("__editable__")} == {
        "eagle3_plugin", "eagle3_plugin.vllm", "eagle3_plugin.vllm.cli"}
    assert not any("vllm" in line.split("|")[-1].strip().split(".")[0] for line in run.stderr.splitlines()
                   if "eagle3" not in line)  # vLLM itself is not imported
