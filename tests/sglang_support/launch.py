"""The real SGLang server on this CPU with the test stand-ins (``eagle3_plugin.sglang.server`` plus this machine's
environment).

    with SGLangServer("checkpoints/target", log_path="/tmp/sgl.log") as server:
        out = server.generate(input_ids, {"max_new_tokens": 32, "temperature": 0})

Runs from any interpreter that can import ``eagle3_plugin``; the server itself runs on SGLang's
(``python=``, default: this one).
"""

import os

from eagle3_plugin.config import CONFIG_FILENAME, Eagle3Config
from eagle3_plugin.sglang import server as _server

SUPPORT_DIR = os.path.dirname(os.path.abspath(__file__))
STOCK_PLUGINS = "eagle3_test_amx"  # SGLANG_PLUGINS for stock SGLang: only the test platform plugin, not eagle3-plugin
# An idle SGLang scheduler polls without pause, a whole core busy (stop 57: two idle servers kept this 2-core VM 100%
# busy, 1.7% with --sleep-on-idle), which slows whatever shares its core: the test beside it, another server.
CPU_ARGS = ("--device", "cpu", "--dtype", "float32", "--mem-fraction-static", "0.15", "--sleep-on-idle")


def server_env(base=None, plugins=None) -> dict:
    """Environment for an SGLang CPU server: CPU engine on, the stand-in sgl_kernel and the has_amx plugin
    (tests/sglang_support) first on PYTHONPATH; ``plugins`` restricts SGLang's general plugins (SGLANG_PLUGINS)."""
    env = dict(os.environ if base is None else base)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SUPPORT_DIR, env.get("PYTHONPATH", "")) if p)
    if plugins is not None:
        env["SGLANG_PLUGINS"] = plugins
    return env


def SGLangServer(model: str, extra_args=(), plugins=None, **kwargs) -> _server.SGLangServer:
    """On the CPU, float32, small memory share (SGLang sizes pools from free RAM); extra_args appended.
    ``plugins=STOCK_PLUGINS`` runs stock SGLang even where eagle3-plugin is installed."""
    return _server.SGLangServer(model, (*CPU_ARGS, *extra_args), env=server_env(plugins=plugins), **kwargs)


def fixed_budget_config(draft: str, path: str, **changes) -> str:
    """Write at ``path`` an ``eagle3.json`` for ``draft`` (its own settings, if it has them, then ``changes``) with
    ``budget: "fixed"``: every step drafts the configured tree, so acceptance compares round for round (the default,
    auto, picks shapes by measured step times). Returns ``path``, for ``--speculative-draft-model-path``."""
    own = os.path.join(draft, CONFIG_FILENAME)
    config = Eagle3Config.load(own) if os.path.isfile(own) else Eagle3Config()
    settings = {**config.to_dict(), **changes, "draft": os.path.abspath(draft), "budget": "fixed"}
    Eagle3Config.from_dict(settings).save(path)
    return path
