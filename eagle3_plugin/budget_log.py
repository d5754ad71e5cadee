"""Why an auto budget (:class:`~eagle3_plugin.budget.TreeBudget`) drafts what it drafts, as JSON lines:
``EAGLE3_BUDGET_LOG=PATH`` turns it on in every engine (a file per process: give each server its own)."""

from __future__ import annotations

import json
import os
from typing import Optional

from .speculator import TreeShape

LOG_ENV = "EAGLE3_BUDGET_LOG"  # a path: an auto budget appends its estimates there
LOG_EVERY = 100  # steps between log lines, besides one at every change of the shape drafted


class BudgetLog:
    """One line per :data:`LOG_EVERY` steps and at every change of the shape drafted (probes included), appended to
    ``path``: the step, the batch, the shape drafted and the one chosen on merit, and each shape's
    :meth:`TreeBudget.estimates` (with its :meth:`TreeBudget.drift`)."""

    def __init__(self, path: str):
        self.path, self._last = path, None

    @classmethod
    def from_env(cls) -> Optional["BudgetLog"]:
        path = os.environ.get(LOG_ENV)
        return cls(path) if path else None

    def write(self, budget, batch: int, shape: TreeShape, wave=None) -> None:
        """After ``budget`` (a :class:`TreeBudget`) chose ``shape`` for ``batch`` requests (a closed ``wave``: a
        :class:`~eagle3_plugin.wave.Wave`, judged by when its last request ends)."""
        if budget.steps % LOG_EVERY and shape == self._last:
            return
        self._last = shape
        line = {"step": budget.steps, "batch": batch, "drafted": shape.label, "chosen": budget.current.label,
                "closed": wave is not None,
                "shapes": {s.label: budget.estimates(s, batch, wave) for s in budget.shapes}}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
