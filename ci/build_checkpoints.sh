#!/usr/bin/env bash
# Rebuild checkpoints/ from scratch: the target (tokenizer + Llama trained on the Python standard
# library sources) and its EAGLE-3 draft (eagle3 train on the target's own answers). About 25 minutes
# on 2 cores. Deterministic for a given Python stdlib, torch build and CPU (see checkpoints/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
# The bundled target stopped at step 1219 of a 1500-step cosine schedule (its 15-minute budget).
.venv/bin/python ci/build_target.py --max-steps 1500 --stop-at-step 1219 --max-minutes 0 --seed 0
.venv/bin/eagle3 train --target checkpoints/target --data checkpoints/prompts/train_prompts.jsonl \
    --out checkpoints/draft --force --regenerate --regen-tokens 128 --draft-vocab 1024 --ttt-steps 7 \
    --batch-size 8 --max-steps 1200 --seed 0
