"""Start the real SGLang server on this CPU with the test stand-ins, and talk to it (stdlib only).

    with SGLangServer("checkpoints/target", log_path="/tmp/sgl.log") as server:
        out = server.generate(input_ids, {"max_new_tokens": 32, "temperature": 0})
        out["output_ids"], out["meta_info"]

Run it with SGLang's interpreter (``.venv-sglang/bin/python``); the server is started with the same one.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

SUPPORT_DIR = os.path.dirname(os.path.abspath(__file__))


STOCK_PLUGINS = "eagle3_test_amx"  # SGLANG_PLUGINS for stock SGLang: only the test platform plugin, not eagle3-plugin


def server_env(base=None, plugins=None) -> dict:
    """Environment for an SGLang CPU server: CPU engine on, the stand-in sgl_kernel and the has_amx plugin
    (tests/sglang_support) first on PYTHONPATH; ``plugins`` restricts SGLang's general plugins (SGLANG_PLUGINS)."""
    env = dict(os.environ if base is None else base)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SUPPORT_DIR, env.get("PYTHONPATH", "")) if p)
    if plugins is not None:
        env["SGLANG_PLUGINS"] = plugins
    return env


def server_command(model: str, port: int, extra_args=(), python=None) -> list:
    """``python -m sglang.launch_server`` on the CPU, float32, small memory share; extra_args appended."""
    return [python or sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--device", "cpu",
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--mem-fraction-static", "0.15",
            *extra_args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SGLangServer:
    """Context manager: start the server (own process group, output to log_path), wait for /health,
    stop it on exit (SIGTERM to the launcher; SIGKILL to its process group after ``stop_timeout`` s).
    ``plugins=STOCK_PLUGINS`` runs stock SGLang even where eagle3-plugin is installed."""

    def __init__(self, model: str, extra_args=(), log_path: str = "sglang_server.log", port=None,
                 start_timeout: float = 900, stop_timeout: float = 60, python=None, plugins=None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = server_command(model, self.port, extra_args, python)
        self.log_path, self.start_timeout, self.stop_timeout = log_path, start_timeout, stop_timeout
        self.plugins = plugins
        self.proc = None

    def __enter__(self):
        self._log = open(self.log_path, "w")
        self._log.write(" ".join(self.command) + "\n")
        self._log.flush()
        self.proc = subprocess.Popen(self.command, env=server_env(plugins=self.plugins), stdout=self._log, stderr=subprocess.STDOUT,
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
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def generate(self, input_ids, sampling_params: dict, timeout: float = 600) -> dict:
        """POST /generate with token ids; returns the response: ``output_ids``, ``meta_info``, ``text``."""
        return post_json(self.url + "/generate", {"input_ids": list(input_ids), "sampling_params": sampling_params},
                         timeout)

    def server_info(self) -> dict:
        with urllib.request.urlopen(self.url + "/server_info", timeout=30) as r:
            return json.loads(r.read())


def post_json(url: str, payload: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())
