"""``eagle3 bench`` + ``eagle3 check`` on the bundled checkpoint: the regression harness catches a worse draft."""

import json
import os
import subprocess
import sys

import pytest
import torch

from bundled import BASELINES, BENCH_ARGS, DRAFT, HELDOUT, ROOT, TARGET
from eagle3_plugin.checkpoint import load_draft, save_draft
from eagle3_plugin.cli import main
from eagle3_plugin.config import Eagle3Config

# engine, speculation shape, committed baseline: every engine the project supports
CASES = {
    "reference-tree": ("reference", [], "reference-tree.json"),
    "reference-chain": ("reference", ["--chain", "5"], "reference-chain.json"),
    "vllm-chain": ("vllm", ["--chain", "5"], "vllm-chain.json"),
    "vllm-tree": ("vllm", [], "vllm-tree.json"),
    "sglang-chain": ("sglang", ["--chain", "5"], "sglang-chain.json"),
    "sglang-tree": ("sglang", [], "sglang-tree.json"),
}
# one per engine: `check` reads only the report, and each engine's chain and tree reports agree with the reference's
# (test_engines_agree_on_acceptance), so an engine that benches the draft it is given carries the drop in both
WORSE_DRAFT_CASES = ["reference-tree", "vllm-tree", "sglang-tree"]
SWEEP = ["--concurrency", "1,4,16"]  # the engines' tree reports also sweep requests in flight (first level: 1)
SWEEP_CASES = ("vllm-tree", "sglang-tree")
SGLANG_SERVER_ARGS = "--device cpu --dtype float32 --mem-fraction-static 0.15"


def bench(tmp_path, engine, draft, *extra, name="report.json"):
    out = tmp_path / name
    args = ["bench", "--engine", engine, "--draft", draft, *BENCH_ARGS, "--json", str(out), *extra]
    if engine == "sglang":  # SGLang has its own environment; its CPU test support comes in through server_env
        sys.path.insert(0, os.path.join(ROOT, "tests", "sglang_support"))
        from launch import server_env
        proc = subprocess.run([os.path.join(ROOT, ".venv-sglang", "bin", "eagle3"), *args, "--engine-args",
                               SGLANG_SERVER_ARGS], env=server_env(), capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stderr[-4000:]
    else:
        assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Bench reports of the bundled draft, one per case, made once for the module."""
    made = {}

    def get(case):
        if case not in made:
            engine, extra, _ = CASES[case]
            work = tmp_path_factory.mktemp(case)
            sweep = [*SWEEP, "--plot", str(work / "sweep.png")] if case in SWEEP_CASES else []
            made[case] = bench(work, engine, DRAFT, *extra, *sweep)
        return made[case]
    return get


@pytest.fixture(scope="module")
def worse_draft(tmp_path_factory):
    """The bundled draft with its fused-feature projection damaged: a realistic silent regression."""
    draft = load_draft(DRAFT)
    torch.manual_seed(0)
    with torch.no_grad():
        draft.fc.weight.add_(torch.randn_like(draft.fc.weight) * draft.fc.weight.std() * 1.5)
    out = tmp_path_factory.mktemp("worse") / "draft"
    save_draft(draft, str(out), Eagle3Config.load(DRAFT))
    return str(out)


@pytest.mark.parametrize("case", CASES)
def test_bench_passes_check_against_the_committed_baseline(reports, case, capsys):
    report_path = reports(case)
    report = json.loads(report_path.read_text())
    for key in ("engine", "mode", "temperature", "num_prompts", "generated_tokens", "mean_acceptance_length",
                "acceptance_per_position", "tokens_per_s", "baseline_tokens_per_s", "speedup", "greedy_match"):
        assert key in report, key
    assert report["greedy_match"] is True and report["num_prompts"] == 8
    assert report["mean_acceptance_length"] > 1.5
    capsys.readouterr()
    assert main(["check", str(report_path), "--baseline", os.path.join(BASELINES, CASES[case][2])]) == 0
    assert "PASS" in capsys.readouterr().out


@pytest.mark.parametrize("case", WORSE_DRAFT_CASES)
def test_check_catches_a_worse_draft(tmp_path, case, worse_draft, capsys):
    engine, extra, baseline = CASES[case]
    report = bench(tmp_path, engine, worse_draft, *extra)
    capsys.readouterr()
    assert main(["check", str(report), "--baseline", os.path.join(BASELINES, baseline)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "mean_acceptance_length" in out


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_engines_agree_on_acceptance(reports, mode):
    """Same draft, prompts and chain or tree: the reference generator, vLLM's counters and SGLang's per-request
    counters give the same figures."""
    ref = json.loads(reports(f"reference-{mode}").read_text())
    assert ref["greedy_match"]
    for engine in ("vllm", "sglang"):
        other = json.loads(reports(f"{engine}-{mode}").read_text())
        assert other["drafting_rounds"] == ref["drafting_rounds"], engine
        assert other["mean_acceptance_length"] == pytest.approx(ref["mean_acceptance_length"], abs=1e-9), engine
        assert other["acceptance_per_position"] == pytest.approx(ref["acceptance_per_position"], abs=1e-9), engine
        assert other["greedy_match"], engine


@pytest.mark.parametrize("case", SWEEP_CASES)
def test_concurrency_sweep_reports_every_level(reports, case):
    """One report, one plot: every level's throughput, latency percentiles and acceptance; the fixed tree accepts
    exactly what it accepts one request at a time, and greedy outputs stay identical under load."""
    report = json.loads(reports(case).read_text())
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 4, 16]
    for level in report["levels"]:
        assert level["num_requests"] == 8 and level["outputs_match"] is True
        assert level["tokens_per_s"] > 0 and level["baseline_tokens_per_s"] > 0
        for figures in (level["latency"], level["baseline_latency"]):
            for name in ("ttft_ms", "tpot_ms"):
                assert 0 < figures[name]["p50"] <= figures[name]["p99"], (name, figures)
        assert level["drafting_rounds"] == report["levels"][0]["drafting_rounds"]
        assert level["acceptance_per_position"] == report["levels"][0]["acceptance_per_position"]
    assert (reports(case).parent / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_two_turn_questions_categories_and_samples(tmp_path):
    """MT-Bench-style questions: the second turn is asked after the engine's own first answer; acceptance per
    category in the JSON; each prompt sampled twice."""
    prompts = tmp_path / "question.jsonl"
    lines = [json.loads(line) for line in open(HELDOUT)][:4]
    prompts.write_text("".join(json.dumps({"category": c, "turns": [r["prompt"], "Now explain it in one line."]}) + "\n"
                               for c, r in zip(["coding", "writing", "coding", "writing"], lines)))
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    assert main(["bench", "--target", TARGET, "--draft", DRAFT, "--prompts", str(prompts), "--max-new-tokens", "16",
                 "--temperature", "1.0", "--samples", "2", "--chain", "3", "--chat-template", "auto",
                 "--json", str(out), "--plot", str(png)]) == 0
    report = json.loads(out.read_text())
    assert report["greedy_match"] is None and report["mode"] == "chain"
    assert report["num_requests"] == 4 * 2 * 2 and report["settings"]["chat_template"] == "plain"
    assert set(report["categories"]) == {"coding", "writing"}
    for figures in report["categories"].values():
        assert figures["num_prompts"] == 4 and 1 <= figures["mean_acceptance_length"] <= 4
    low, high = report["mean_acceptance_length_ci95"]
    assert low < report["mean_acceptance_length"] < high
    assert len(report["acceptance_per_position"]) == 3
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_check_at_temperature_fails_only_a_significant_drop(tmp_path, worse_draft, capsys):
    """Two T=0.2 reports of the same draft from different seeds pass; the damaged draft fails. (At T=1 this small
    target's flat distributions make the damage cost too little acceptance to show in a test-sized run.)"""
    sampled = ["--temperature", "0.2", "--samples", "4", "--max-new-tokens", "32"]
    args = ["bench", "--target", TARGET, "--prompts", HELDOUT, "--max-prompts", "8", *sampled]
    paths = {name: tmp_path / f"{name}.json" for name in ("seed0", "seed1", "worse")}
    assert main([*args, "--draft", DRAFT, "--seed", "0", "--json", str(paths["seed0"])]) == 0
    assert main([*args, "--draft", DRAFT, "--seed", "1", "--json", str(paths["seed1"])]) == 0
    assert main([*args, "--draft", worse_draft, "--seed", "1", "--json", str(paths["worse"])]) == 0
    capsys.readouterr()
    assert main(["check", str(paths["seed1"]), "--baseline", str(paths["seed0"])]) == 0
    assert "T>0" in capsys.readouterr().out
    assert main(["check", str(paths["worse"]), "--baseline", str(paths["seed0"])]) == 1


def test_malformed_prompt_file_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "def f():"}\n{"prompt": "x"\n')
    assert main(["bench", "--target", TARGET, "--draft", DRAFT, "--prompts", str(bad)]) == 2
    assert f"{bad}:2: not valid JSON" in capsys.readouterr().err
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"id": 1}\n')
    assert main(["bench", "--target", TARGET, "--draft", DRAFT, "--prompts", str(missing)]) == 2
    assert f"{missing}:1: no prompt field" in capsys.readouterr().err


def test_check_refuses_reports_measured_differently(tmp_path, capsys):
    base = json.load(open(os.path.join(BASELINES, "reference-tree.json")))
    other = dict(base, temperature=1.0)
    (tmp_path / "a.json").write_text(json.dumps(other))
    assert main(["check", str(tmp_path / "a.json"), "--baseline", os.path.join(BASELINES, "reference-tree.json")]) == 2
    assert "measured differently" in capsys.readouterr().err


def test_vllm_bench_takes_the_context_length_from_the_target(tmp_path):
    """A target whose config allows 512 positions benches on vLLM with no extra flag (no hard-coded length), run as a
    user runs it: the report alone on stdout, vLLM's logs (its engine process's too) on stderr."""
    import shutil
    target = tmp_path / "target-512"
    shutil.copytree(TARGET, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 512}))
    out = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_STREAM"}
    proc = subprocess.run([os.path.join(ROOT, ".venv", "bin", "eagle3"), "bench", "--engine", "vllm", "--target",
                           str(target), "--draft", DRAFT, "--prompts", HELDOUT, "--max-prompts", "2",
                           "--max-new-tokens", "8", "--chain", "3", "--json", str(out)],
                          env={**env, "VLLM_LOGGING_LEVEL": "INFO"}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(out.read_text())["greedy_match"] is True
    assert "INFO" in proc.stderr and "EngineCore" in proc.stderr  # vLLM did log, its engine process too
    assert "INFO" not in proc.stdout and "EngineCore" not in proc.stdout and proc.stdout.lstrip().startswith("#")
