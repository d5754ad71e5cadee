"""Why an auto budget (:class:`~eagle3_plugin.budget.TreeBudget`) drafts what it drafts, as JSON lines:
``EAGLE3_BUDGET_LOG=PATH`` turns it on in every engine (a file per process: give each server its own)."""

from __future__ import annotations

import json
import os
from typing import Optional

from .errors import Eagle3Error
from .speculator import TreeShape

LOG_ENV = "EAGLE3_BUDGET_LOG"  # a path: an auto budget appends its estimates there
LOG_EVERY = 100  # steps between log lines, besides one at every change of the shape drafted or of a closed batch


class BudgetLog:
    """One line per :data:`LOG_EVERY` steps and at every change of the shape drafted (probes included) or of whether
    the batch is judged closed, appended to ``path``: the step, the batch, the shape drafted and the one chosen on
    merit, whether the batch is closed, and each shape's :meth:`TreeBudget.estimates` (with its
    :meth:`TreeBudget.drift`)."""

    def __init__(self, path: str):
        self.path, self._last = path, None  # the last step's (shape drafted, closed)

    @classmethod
    def from_env(cls) -> Optional["BudgetLog"]:
        path = os.environ.get(LOG_ENV)
        return cls(path) if path else None

    def write(self, budget, batch: int, shape: TreeShape, wave=None) -> None:
        """After ``budget`` (a :class:`TreeBudget`) chose ``shape`` for ``batch`` requests (a closed ``wave``: a
        :class:`~eagle3_plugin.wave.Wave`, judged by when its last request ends)."""
        closed = wave is not None
        if budget.steps % LOG_EVERY and (shape, closed) == self._last:
            return
        self._last = shape, closed
        line = {"step": budget.steps, "batch": batch, "drafted": shape.label, "chosen": budget.current.label,
                "closed": closed,
                "shapes": {s.label: budget.estimates(s, batch, wave) for s in budget.shapes}}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")


def drafted_shares(path: str) -> tuple[int, dict[str, float]]:
    """What a :class:`BudgetLog` at ``path`` says was drafted: the steps its lines cover (from its first line's step
    to its last's, inclusive) and each shape's share of them (every shape the log estimates, drafted or not). Exact,
    since a line marks every change of the shape drafted: a shape holds from its line up to the next. The steps after
    the last line (fewer than :data:`LOG_EVERY`, all of its shape) are not counted. ``(0, {})`` for an empty log."""
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines:
        return 0, {}
    steps = dict.fromkeys(lines[-1]["shapes"], 0)
    for line, following in zip(lines, lines[1:]):
        if following["step"] <= line["step"]:
            raise Eagle3Error(f"{path}: more than one budget's lines (step {following['step']} follows "
                              f"{line['step']}); give each server a log of its own")
        steps[line["drafted"]] += following["step"] - line["step"]
    steps[lines[-1]["drafted"]] += 1
    total = sum(steps.values())
    return total, {label: n / total for label, n in steps.items()}


def drafted_summary(path: str, whose: str) -> str:
    """One line for a reader: what the log at ``path`` says ``whose`` budget drafted (:func:`drafted_shares`), or why
    that is not known."""
    try:
        steps, shares = drafted_shares(path)
    except Eagle3Error as e:  # e.g. a log named by the caller, holding an earlier run's lines too
        return f"what {whose} drafted is not known: {e}"
    return (f"{whose} drafted, over the {steps} steps its log covers: "
            + ", ".join(f"{label} on {share:.0%}" for label, share in shares.items()))
