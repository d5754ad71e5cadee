"""Helper for the vLLM tests: run ``LLM`` in a fresh process (plugins load once per process)."""

import json
import os
import signal
import subprocess
import sys


def run_llm(spec: dict, plugins: str = "eagle3", timeout: int = 900, env: dict = None) -> dict:
    """Run ``run_llm.py`` in its own process with ``VLLM_PLUGINS=plugins`` ('' disables every plugin) and ``env``
    added to its environment; its result."""
    proc = run_llm_process(spec, plugins, timeout, env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    errors = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if "Error" in line)  # root cause
    assert proc.returncode == 0 and lines, errors[-4000:] + "\n" + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def run_llm_process(spec: dict, plugins: str = "eagle3", timeout: int = 900,
                    env: dict = None) -> subprocess.CompletedProcess:
    """:func:`run_llm`'s process, finished. After ``timeout`` seconds it is killed with the engine processes it
    started (a hung engine would hold the CPUs for the rest of the tests), and ``subprocess.TimeoutExpired`` raised."""
    env = dict(os.environ, VLLM_PLUGINS=plugins, VLLM_CPU_KVCACHE_SPACE="1", **(env or {}))
    with subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "run_llm.py")], env=env, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(json.dumps(spec), timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
