#!/usr/bin/env bash
# The whole test suite, after setting up .venv/ and .venv-sglang/ when needed. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/setup_sglang.sh  # the SGLang tests run the real server from its own environment, .venv-sglang
# Two workers, a test file each at a time (a file's engines are shared by its tests): most of a test's time is an
# engine starting, which is one core's work, so two files run side by side on a 2-core machine.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile "$@"
