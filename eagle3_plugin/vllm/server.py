"""Run ``vllm serve`` as a child process on 127.0.0.1, and talk to it (stdlib only).

Used by the served demo and the server tests: start, wait until healthy, stream completions, read the
speculative-decoding counters from ``/metrics``, stop.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import sys
import time
from dataclasses import dataclass

from ..serving import ServerProcess, free_port

SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


@contextlib.contextmanager
def running_server(model: str, args: list[str], log_path: str, startup_timeout: float = 600.0):
    """Yield ``(host, port)`` of a healthy server; always stops it.

    SIGTERM goes to the server process alone and the server drains (``--shutdown-timeout``), so vLLM stops
    its engine processes in order (an abort, vLLM's default, logs an EngineDeadError); SIGKILL to the group
    only if it has not exited 60 s later.
    """
    port = free_port()
    vllm = os.path.join(os.path.dirname(sys.executable), "vllm")  # vLLM's own CLI, as a user types it
    cmd = [vllm, "serve", model, "--host", "127.0.0.1", "--port", str(port),
           "--shutdown-timeout", "30", *args]  # drain on SIGTERM instead of aborting the engine
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    with ServerProcess(cmd, port, log_path, env=env, start_timeout=startup_timeout, name="vLLM server"):
        yield "127.0.0.1", port


@dataclass
class Completion:
    text: str
    tokens: int
    seconds: float


def stream_completion(host: str, port: int, model: str, prompt, max_tokens: int, temperature: float = 0.0,
                      timeout: float = 300.0) -> Completion:
    """One streaming ``/v1/completions`` request (``prompt``: text or token ids)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                       "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:500]!r}")
    text, tokens = [], 0
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: "):])
        text += [c["text"] for c in event.get("choices", [])]
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    return Completion("".join(text), tokens, time.perf_counter() - start)


def spec_counters(host: str, port: int) -> dict[str, float]:
    """The server's cumulative speculative-decoding counters (``vllm:spec_decode_*_total``)."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", "/metrics")
    metrics = conn.getresponse().read().decode()
    out = {}
    for name in SPEC_COUNTERS:
        match = re.search(rf"^vllm:spec_decode_{name}_total\{{[^}}]*\}} ([0-9.e+]+)$", metrics, re.M)
        out[name] = float(match.group(1)) if match else 0.0
    return out
