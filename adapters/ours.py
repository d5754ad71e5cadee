"""Ours: the vLLM-ready layout (official names, capture ids in config.json) with ``eagle3.json`` beside it.

Every adapter writes ``eagle3.json``, so on reading, a folder of ours is detected as ``vllm``.
"""

from .vllm import write  # noqa: F401  (the same files)

NAME = "ours"
