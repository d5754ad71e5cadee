"""Benchmarks that run where the suite runs, in their small mode, so they keep working between the runs that use
them."""

import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_cuda_core_runs_on_a_cpu_and_finds_greedy_identical():
    """``benchmarks/cuda_core.py`` is run on a lent GPU; its quick mode on a CPU checks the same greedy identity."""
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks/cuda_core.py"), "--device", "cpu", "--quick"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "greedy identical on cpu: yes" in run.stdout
    assert "| bundled (fp32) | tree 5/8/32 | 1 |" in run.stdout
