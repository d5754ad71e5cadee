"""Helper for the vLLM tests: run ``LLM`` in a fresh process (plugins load once per process)."""

import json
import os
import subprocess
import sys


def run_llm(spec: dict, plugins: str = "eagle3", timeout: int = 900, env: dict = None) -> dict:
    """Run ``run_llm.py`` in its own process with ``VLLM_PLUGINS=plugins`` ('' disables every plugin) and ``env``
    added to its environment."""
    env = dict(os.environ, VLLM_PLUGINS=plugins, VLLM_CPU_KVCACHE_SPACE="1", **(env or {}))
    proc = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "run_llm.py")],
                          input=json.dumps(spec), capture_output=True, text=True, env=env, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    errors = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if "Error" in line)  # root cause
    assert proc.returncode == 0 and lines, errors[-4000:] + "\n" + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])
