"""How many requests wait in vLLM's scheduler, handed to the worker with each step's ``SchedulerOutput``.

vLLM's runner sees only the requests it runs. A batch with requests waiting is refilled as its requests end (an
offline ``LLM.generate`` of more prompts than ``max_num_seqs``, a server under more load than its batch), so it is
never a closed batch (:class:`~eagle3_plugin.wave.QuietBatch`), however its requests joined. The engine core's
scheduler knows; its ``schedule`` is wrapped to attach the count (the runner runs in the engine core's process on one
device).
"""

from __future__ import annotations

ATTRIBUTE = "eagle3_waiting"


def install() -> None:
    """Each ``SchedulerOutput`` carries how many requests wait after it was scheduled."""
    from vllm.v1.core.sched.scheduler import Scheduler

    schedule = Scheduler.schedule
    if getattr(schedule, "_eagle3_wrapped", False):
        return

    def counting_schedule(self, *args, **kwargs):
        output = schedule(self, *args, **kwargs)
        setattr(output, ATTRIBUTE, self.get_request_counts()[1])
        return output

    counting_schedule._eagle3_wrapped = True
    Scheduler.schedule = counting_schedule


def waiting(scheduler_output) -> int:
    """Requests waiting when ``scheduler_output`` was scheduled (0 when it was not counted)."""
    return getattr(scheduler_output, ATTRIBUTE, 0)
