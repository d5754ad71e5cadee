"""What the benchmarks here read unless told otherwise: the bundled target, draft and held-out prompts."""

import argparse
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def bundled_parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser described by ``doc``'s first line, with ``--target``, ``--draft`` and ``--prompts``."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--target", default=os.path.join(ROOT, "checkpoints/target"))
    p.add_argument("--draft", default=os.path.join(ROOT, "checkpoints/draft"))
    p.add_argument("--prompts", default=os.path.join(ROOT, "checkpoints/prompts/heldout.jsonl"))
    return p
