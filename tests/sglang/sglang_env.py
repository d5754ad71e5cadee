"""Where SGLang's environment and the test support live, and a server factory for tests (run from ``.venv``)."""

import os
import sys

from bundled import ROOT

SGLANG_PYTHON = os.path.join(ROOT, ".venv-sglang", "bin", "python")
SUPPORT = os.path.join(ROOT, "tests", "sglang_support")
COMPARE = os.path.join(SUPPORT, "compare_greedy.py")
sys.path.insert(0, SUPPORT)
from launch import STOCK_PLUGINS, SGLangServer, fixed_budget_config, server_env  # noqa: E402

assert os.path.exists(SGLANG_PYTHON), "no .venv-sglang: run bash ci/setup.sh"


OUR_TREE = ["--speculative-num-steps", "5", "--speculative-eagle-topk", "8", "--speculative-num-draft-tokens", "32"]


def our_tree_args(draft: str) -> list:
    """Server arguments for our tree 5/8/32 from ``draft`` (a folder, or an ``eagle3.json``)."""
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft, *OUR_TREE]


def server(model: str, extra_args, log_path: str, plugins=None) -> SGLangServer:
    """The real SGLang server (SGLang's interpreter) for ``model``; eagle3-plugin unless ``plugins=STOCK_PLUGINS``."""
    return SGLangServer(model, extra_args, log_path=log_path, python=SGLANG_PYTHON, plugins=plugins)


__all__ = ["COMPARE", "SGLANG_PYTHON", "STOCK_PLUGINS", "fixed_budget_config", "our_tree_args", "server", "server_env"]
