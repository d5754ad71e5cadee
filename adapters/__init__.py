"""Checkpoint-format adapters for EAGLE-3 drafts (shipped as ``eagle3_plugin.adapters``).

Every format reads into and writes from one canonical in-memory form, :class:`CanonicalDraft`
(official EAGLE tensor names, :class:`~eagle3_plugin.draft.DraftConfig`, capture ids in our rule), so
any format converts to any other. Formats are detected from the folder alone; every output also carries
our ``eagle3.json``, which supplies settings and capture ids to formats that cannot record them.
"""

from __future__ import annotations

from ..errors import Eagle3Error
from . import eagle, ours, sglang, specforge, speculators, vllm
from .canonical import CanonicalDraft, apply_sidecar

FORMATS = {m.NAME: m for m in (speculators, specforge, vllm, eagle)}  # detection order
WRITERS = {m.NAME: m.write for m in (eagle, specforge, sglang, speculators, vllm, ours)}


def detect(folder: str) -> str:
    """The format of the draft in ``folder`` (the first adapter whose ``detect`` accepts it)."""
    for name, module in FORMATS.items():
        if module.detect(folder):
            return name
    raise Eagle3Error(f"{folder}: not an EAGLE-3 draft in any known format ({', '.join(FORMATS)})")


def read(folder: str) -> CanonicalDraft:
    return apply_sidecar(folder, FORMATS[detect(folder)].read(folder))


__all__ = ["CanonicalDraft", "FORMATS", "WRITERS", "detect", "read"]
