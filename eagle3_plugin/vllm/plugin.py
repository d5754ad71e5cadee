"""The ``vllm.general_plugins`` entry point: check the engine, then install our pieces."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def register() -> None:
    """Called by vLLM once per process. Raises :class:`~.compat.UnsupportedVllm` on a version we don't know."""
    from .compat import check_vllm

    version = check_vllm()
    from . import admission, capture, cpu_sampling, draft_handoff, speculative, tree_attention, tree_runner, waiting

    cpu_sampling.install()
    capture.install()
    speculative.install()
    tree_attention.install()
    tree_runner.install()
    draft_handoff.install()
    waiting.install()
    admission.install()
    logger.info("eagle3-plugin registered on vLLM %s: tree worker, request admission, CPU speculative-sampling fix, "
                "capture for any target", version)
