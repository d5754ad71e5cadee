"""Start an SGLang server as a subprocess and talk to it over HTTP (standard library only: importable from any
environment, e.g. a test or bench process whose own interpreter has no SGLang).

    with SGLangServer("path/to/target", ["--speculative-algorithm", "EAGLE3", ...], log_path="sgl.log") as s:
        out = s.generate(input_ids, {"max_new_tokens": 32, "temperature": 0})
        out["output_ids"], out["meta_info"]
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from dataclasses import dataclass

from ..server_process import ServerProcess, free_port

WARMUP_GAVE_UP = "Initialization failed. warmup error"  # SGLang's log line before it kills itself


class SGLangServer(ServerProcess):
    """Context manager: ``python -m sglang.launch_server --model-path MODEL --host 127.0.0.1 --port P
    *extra_args``, started and stopped as :class:`~eagle3_plugin.server_process.ServerProcess` does. ``python``:
    SGLang's interpreter (default: this one); ``env``: the server's environment (default: this process's).

    SGLang's own warm-up gives its HTTP server 120 s to answer, then kills the server (``http_server.py``,
    ``_execute_server_warmup``): a start-up slowed by other work on the machine dies that way with nothing wrong.
    That one failure is retried once, on a new port (the first attempt's log kept beside, as ``LOG.1``)."""

    def __init__(self, model: str, extra_args=(), log_path: str = "sglang_server.log", port=None,
                 start_timeout: float = 900, stop_timeout: float = 60, python=None, env=None):
        self._launch = [python or sys.executable, "-m", "sglang.launch_server", "--model-path", model,
                        "--host", "127.0.0.1"]
        self._extra_args = list(extra_args)
        port = port or free_port()
        super().__init__(self._command(port), port, log_path, env=env, start_timeout=start_timeout,
                         stop_timeout=stop_timeout, name="SGLang server")

    def _command(self, port: int) -> list[str]:
        return [*self._launch, "--port", str(port), *self._extra_args]

    def __enter__(self):
        try:
            return super().__enter__()
        except RuntimeError:
            if not self._warmup_gave_up():
                raise
        os.replace(self.log_path, self.log_path + ".1")
        self.port = free_port()
        self.command = self._command(self.port)
        return super().__enter__()

    def _warmup_gave_up(self) -> bool:
        with open(self.log_path, errors="replace") as log:
            return WARMUP_GAVE_UP in log.read()

    def generate(self, input_ids, sampling_params: dict, timeout: float = 600):
        """POST /generate with token ids (one list, or a list of lists for a batch); returns the response(s):
        ``output_ids``, ``meta_info``, ``text``."""
        return post_json(self.url + "/generate", {"input_ids": list(input_ids), "sampling_params": sampling_params},
                         timeout)

    def stream_generate(self, input_ids, sampling_params: dict, timeout: float = 600) -> Streamed:
        """One request's ``/generate``, streamed (for its time to first token)."""
        return stream_json(self.url + "/generate", {"input_ids": list(input_ids), "sampling_params": sampling_params},
                           timeout)


@dataclass
class Streamed:
    """A streamed ``/generate``: every output id, the final ``meta_info``, and ``time.perf_counter()`` times of
    the request, its first output id and its end."""

    output_ids: list
    meta_info: dict
    started: float
    first_token: float
    finished: float


def stream_json(url: str, payload: dict, timeout: float = 600) -> Streamed:
    """POST a streaming ``/generate`` (SGLang's default, non-incremental stream: each event carries all output ids
    so far) and follow it to the end."""
    req = urllib.request.Request(url, data=json.dumps({**payload, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    started, first_token, last = time.perf_counter(), None, None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            last = json.loads(line[len("data: "):])
            if first_token is None and last.get("output_ids"):
                first_token = time.perf_counter()
    if last is None:
        raise RuntimeError(f"{url}: the stream ended without an event")
    return Streamed(list(last["output_ids"]), last["meta_info"], started, first_token, time.perf_counter())


def post_json(url: str, payload: dict, timeout: float = 600):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())
