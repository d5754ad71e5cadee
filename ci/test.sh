#!/usr/bin/env bash
# The whole test suite, after setting up .venv/ when needed. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
