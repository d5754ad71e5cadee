"""Benchmarks that run where the suite runs, in their small mode, so they keep working between the runs that use
them."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_cuda_core_runs_on_a_cpu_and_finds_greedy_identical():
    """``benchmarks/cuda_core.py`` is run on a lent GPU; its quick mode on a CPU checks the same greedy identity."""
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks/cuda_core.py"), "--device", "cpu", "--quick"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "greedy identical on cpu: yes" in run.stdout
    assert "| bundled (fp32) | tree 5/8/32 | 1 |" in run.stdout


# Benchmarks that reach into our vLLM worker (its budget, timings, grammar masks), on tiny settings: a change of those
# internals that breaks one shows here, not at its next use (stop 55's `TreeBudget.shape` keyword broke three unseen).
WORKER_BENCHMARKS = {
    "vllm_step_overhead.py": ["--rounds", "1"],
    "vllm_draft_handoff.py": ["--rounds", "1", "--shape", "chain"],
    "vllm_closed_batch.py": ["--rounds", "1"],
    "vllm_grammar_drafts.py": ["--rounds", "1"],
}


@pytest.mark.parametrize("script", sorted(WORKER_BENCHMARKS))
def test_vllm_worker_benchmarks_run_and_find_outputs_identical(script):
    args = ["--batch", "2", "--max-new-tokens", "8", *WORKER_BENCHMARKS[script]]
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert re.search(r"^outputs identical( to no speculation)?: yes$", run.stdout, re.M), run.stdout
