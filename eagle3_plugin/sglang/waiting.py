"""How many requests wait in SGLang's scheduler, handed to our worker with each batch it runs.

The worker sees only the batch it runs. A batch with requests waiting is refilled as its requests end (a burst of more
requests than ``--max-running-requests``, a server under more load than its token pool holds), so it is never a closed
batch (:class:`~eagle3_plugin.wave.QuietBatch`), however its requests joined. The scheduler knows: a hook before its
``run_batch`` writes the count on the batch (the worker runs in the scheduler's process).
"""

from __future__ import annotations

ATTRIBUTE = "eagle3_waiting"


def count_waiting(scheduler, batch, *args, **kwargs) -> None:
    """SGLang's ``Scheduler.run_batch``, before it runs: note on ``batch`` how many requests wait."""
    setattr(batch, ATTRIBUTE, len(scheduler.waiting_queue))


def waiting(batch) -> int:
    """Requests waiting when ``batch`` was handed to the worker (0 when it was not counted)."""
    return getattr(batch, ATTRIBUTE, 0)
