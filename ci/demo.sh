#!/usr/bin/env bash
# The main job: speculative decoding on the bundled checkpoint, printing acceptance and speed
# side by side with plain decoding (the reference generator; engines are added by their issues).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
exec .venv/bin/eagle3 bench --engine reference --target checkpoints/target --draft checkpoints/draft \
    --prompts checkpoints/prompts/heldout.jsonl --max-prompts 16 --max-new-tokens 96 "$@"
