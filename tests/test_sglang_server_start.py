"""SGLangServer's start-up, against a stand-in ``sglang.launch_server`` (a module on the server's PYTHONPATH): the one
failure it retries (SGLang's warm-up gave up on its own HTTP server and killed it) and the ones it does not."""

import os
import sys
import textwrap

import pytest

from eagle3_plugin.sglang.server import WARMUP_GAVE_UP, SGLangServer

STAND_IN = textwrap.dedent('''
    import http.server, os, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    starts = os.path.join(os.environ["STAND_IN_DIR"], "starts")
    with open(starts, "a") as f:
        f.write(f"{port}\\n")
    failures = int(os.environ["STAND_IN_FAILURES"])
    if sum(1 for _ in open(starts)) <= failures:
        print(os.environ["STAND_IN_MESSAGE"], flush=True)
        sys.exit(1)

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
''')


def stand_in(tmp_path, failures: int, message: str) -> dict:
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(STAND_IN)
    return {**os.environ, "PYTHONPATH": str(tmp_path), "STAND_IN_DIR": str(tmp_path),
            "STAND_IN_FAILURES": str(failures), "STAND_IN_MESSAGE": message}


def starts(tmp_path) -> list[int]:
    return [int(line) for line in (tmp_path / "starts").read_text().split()]


def test_a_warmup_that_gave_up_is_started_again_on_a_new_port(tmp_path):
    log = str(tmp_path / "server.log")
    env = stand_in(tmp_path, failures=1, message=f"[2026] ERROR {WARMUP_GAVE_UP}: Traceback ...")
    with SGLangServer("model", log_path=log, python=sys.executable, env=env, start_timeout=60) as server:
        first, second = starts(tmp_path)
        assert server.port == second != first and server.url.endswith(f":{second}")
        assert WARMUP_GAVE_UP in open(log + ".1").read()  # the first attempt's log, kept
        assert f"--port {second}" in open(log).readline()


@pytest.mark.parametrize("failures, message", [(1, "Traceback: the model failed to load"),
                                               (2, f"ERROR {WARMUP_GAVE_UP}")])
def test_other_failures_and_a_second_give_up_are_raised(tmp_path, failures, message):
    log = str(tmp_path / "server.log")
    with pytest.raises(RuntimeError, match="exited with 1 during start-up"):
        with SGLangServer("model", log_path=log, python=sys.executable, env=stand_in(tmp_path, failures, message),
                          start_timeout=60):
            pass
    assert len(starts(tmp_path)) == min(failures, 2)
