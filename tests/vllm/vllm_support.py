"""Helpers for the vLLM tests: a fresh-process LLM runner and a vLLM-ready copy of the bundled draft."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from bundled import DRAFT


def run_llm(spec: dict, plugins: str = "eagle3", timeout: int = 900) -> dict:
    """Run ``run_llm.py`` in its own process with ``VLLM_PLUGINS=plugins`` ('' disables every plugin)."""
    env = dict(os.environ, VLLM_PLUGINS=plugins, VLLM_CPU_KVCACHE_SPACE="1")
    proc = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "run_llm.py")],
                          input=json.dumps(spec), capture_output=True, text=True, env=env, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="session")
def vllm_draft(tmp_path_factory):
    """The bundled draft with its capture ids in config.json, where vLLM reads them (same rule as ours)."""
    out = tmp_path_factory.mktemp("vllm") / "draft"
    shutil.copytree(DRAFT, out)
    config = json.loads((out / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = json.loads((out / "eagle3.json").read_text())["layer_ids"]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return str(out)
