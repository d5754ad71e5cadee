#!/usr/bin/env bash
# The whole test suite, after setting up .venv/ and .venv-sglang/ when needed. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/setup_sglang.sh  # the SGLang tests run the real server from its own environment, .venv-sglang
# One worker per core (at most 2: memory), test files whole per worker (their engines are module fixtures).
workers=$(( $(nproc) < 2 ? 1 : 2 ))
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" --dist loadfile "$@"
