"""Run ``vllm serve`` as a child process on 127.0.0.1 (stdlib only): start, wait until healthy, stop. Talk to it
with :mod:`eagle3_plugin.openai_api`."""

from __future__ import annotations

import contextlib
import os
import sys

from ..server_process import ServerProcess, free_port


@contextlib.contextmanager
def running_server(model: str, args: list[str], log_path: str, startup_timeout: float = 600.0):
    """Yield the base URL (``http://127.0.0.1:PORT``) of a healthy server; always stops it.

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
        yield f"http://127.0.0.1:{port}"
