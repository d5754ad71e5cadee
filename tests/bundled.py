"""Paths of the bundled checkpoint and the bench settings its committed baselines were made with."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "checkpoints", "target")
DRAFT = os.path.join(ROOT, "checkpoints", "draft")
HELDOUT = os.path.join(ROOT, "checkpoints", "prompts", "heldout.jsonl")
BASELINES = os.path.join(ROOT, "checkpoints", "baselines")

# `eagle3 bench` arguments shared by the committed baselines and the regression tests.
BENCH_ARGS = ["--target", TARGET, "--prompts", HELDOUT, "--max-prompts", "8", "--max-new-tokens", "48"]
