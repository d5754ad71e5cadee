"""Start an SGLang server as a subprocess and talk to it over HTTP (standard library only: importable from any
environment, e.g. a test or bench process whose own interpreter has no SGLang).

    with SGLangServer("path/to/target", ["--speculative-algorithm", "EAGLE3", ...], log_path="sgl.log") as s:
        out = s.generate(input_ids, {"max_new_tokens": 32, "temperature": 0})
        out["output_ids"], out["meta_info"]
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SGLangServer:
    """Context manager: start ``python -m sglang.launch_server --model-path MODEL --host 127.0.0.1 --port P
    *extra_args`` (own process group, output to ``log_path``), wait for ``/health``, stop it on exit (SIGTERM
    to the launcher; SIGKILL to its process group after ``stop_timeout`` s). ``python``: SGLang's interpreter
    (default: this one); ``env``: the server's environment (default: this process's)."""

    def __init__(self, model: str, extra_args=(), log_path: str = "sglang_server.log", port=None,
                 start_timeout: float = 900, stop_timeout: float = 60, python=None, env=None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [python or sys.executable, "-m", "sglang.launch_server", "--model-path", model,
                        "--host", "127.0.0.1", "--port", str(self.port), *extra_args]
        self.env = env
        self.log_path, self.start_timeout, self.stop_timeout = log_path, start_timeout, stop_timeout
        self.proc = None
        self._log = None

    def __enter__(self):
        self._log = open(self.log_path, "w")
        self._log.write(" ".join(self.command) + "\n")
        self._log.flush()
        self.proc = subprocess.Popen(self.command, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def _wait_healthy(self):
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(2)
        raise TimeoutError(f"SGLang server not healthy after {self.start_timeout} s; see {self.log_path}")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the launcher drains, then stops its own workers
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc is not None:
            try:  # workers left behind in its process group (start_new_session: the server leads it)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def generate(self, input_ids, sampling_params: dict, timeout: float = 600):
        """POST /generate with token ids (one list, or a list of lists for a batch); returns the response(s):
        ``output_ids``, ``meta_info``, ``text``."""
        return post_json(self.url + "/generate", {"input_ids": list(input_ids), "sampling_params": sampling_params},
                         timeout)

    def server_info(self) -> dict:
        with urllib.request.urlopen(self.url + "/server_info", timeout=30) as r:
            return json.loads(r.read())


def post_json(url: str, payload: dict, timeout: float = 600):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())
