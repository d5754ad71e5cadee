"""The ``vllm.general_plugins`` entry point: check the engine, then install our pieces."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def register() -> None:
    """Called by vLLM once per process. Raises :class:`~.compat.UnsupportedVllm` on a version we don't know."""
    from . import capture, cpu_sampling
    from .compat import check_vllm

    version = check_vllm()
    cpu_sampling.install()
    capture.install()
    logger.info("eagle3-plugin registered on vLLM %s: CPU speculative-sampling fix, capture for any target",
                version)
