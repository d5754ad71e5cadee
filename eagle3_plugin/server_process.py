"""A server as a child process on 127.0.0.1: start it, wait until healthy, stop it (standard library only).

Shared by the vLLM and SGLang integrations and by the demo, bench and tests that drive their servers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """Context manager running ``command`` in its own process group, stdout and stderr to ``log_path`` (first
    line: the command). Entering waits until ``GET /health`` on ``port`` answers 200, and raises if the process
    exits or ``start_timeout`` passes first. Stopping sends SIGTERM to the process alone (engines drain, then
    stop their own workers), SIGKILL to its group after ``stop_timeout`` s, then to anything left in the group.
    """

    def __init__(self, command: list[str], port: int, log_path: str, env=None, start_timeout: float = 600,
                 stop_timeout: float = 60, name: str = "server"):
        self.command, self.port, self.log_path, self.env = command, port, log_path, env
        self.start_timeout, self.stop_timeout, self.name = start_timeout, stop_timeout, name
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        with open(self.log_path, "w") as log:
            log.write(" ".join(self.command) + "\n")
            log.flush()
            self.proc = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while not self._healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} during start-up; "
                                   f"see {self.log_path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not healthy after {self.start_timeout:.0f} s; see {self.log_path}")
            time.sleep(1.0)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError):  # workers left behind in its group (the server leads it)
            os.killpg(self.proc.pid, signal.SIGKILL)
