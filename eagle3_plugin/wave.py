"""A batch nothing joins, judged by when its last request ends rather than by tokens per step.

Judged step by step, a shape is worth the tokens a step gives per second of step (:meth:`TreeBudget.tokens_per_second`):
right while each request that ends is replaced at once, as under a stream of requests. In a closed batch
(:class:`QuietBatch`: an offline list of prompts, a burst on an idle server, a benchmark's last wave) a slot freed
early stays empty, and the batch runs until its slowest request ends, over ever smaller steps. Without speculation,
requests that started together with as many tokens to go end together; a shape that drafts moves each request at its
own acceptance, so the ends spread, and the batch drains over a tail of steps few requests share (stop 44, run W at 32
requests: the chain, ahead by 5-10% a step, ran the pass at 0.68x no speculation). Such a batch is worth its tokens to
go per second until its last request ends (:func:`wave_seconds`), each request moving at its own acceptance
(:class:`RequestAcceptance`)."""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from functools import cached_property
from typing import Callable, Optional

import torch

QUIET_STEPS = 8  # steps without a request joining, after one ended, before a batch is read as draining
IDLE_SECONDS = 0.1  # a gap between steps this long: the engine was idle (a refill by a client comes sooner)
WARM_STEPS = 64  # steps after an idle gap that may still run slow (:attr:`QuietBatch.warming`)
PRIOR_ROUNDS = 6.0  # a request's own mean counts as this many rounds of the recent mean too (few rounds say little)
REQUEST_MEMORY = 0.95  # weight of the past per round in a request's own mean (about its last 20 rounds)
POOL_SIZE = 64  # ended requests whose acceptance stands for requests not drafted for yet
POOL_ROUNDS = 4  # rounds a request needs to enter the pool
POOL_MIN = 8  # ended requests in the pool before it stands for unknown ones


class Wave:
    """A closed batch, by row: each request's id, and the tokens it has left at most (``remaining [B]``: its length
    limit; an end-of-sequence token may end it sooner), read from ``tokens_left()`` when first asked for (the budget
    reads it every few steps only: ~50 µs a step at 32 requests in vLLM)."""

    def __init__(self, requests: list, tokens_left: Callable[[], torch.Tensor], number: int = 0):
        """``number``: which closed batch this is (:class:`QuietBatch` counts them): a step of the next one is a new
        batch to judge, even right after the last."""
        self.requests, self._tokens_left, self.number = requests, tokens_left, number

    @cached_property
    def remaining(self) -> torch.Tensor:
        return self._tokens_left()


class QuietBatch:
    """Whether the batch is closed, as far as its steps tell: its requests joined together on an idle engine (a list of
    prompts, a burst; nothing ran for :data:`IDLE_SECONDS` before) and none has joined since, or a request ended and
    none joined in the :data:`QUIET_STEPS` steps since (the batch drains). Requests joining where others just ended
    refill the batch, as under a stream (a server's clients, a benchmark keeping N requests in flight): open. Once the
    engine has been refilled so, it is fed as a stream (:attr:`streamed`), and a batch whose requests all ended in one
    step and that fills again at once is refilled too. A shim calls :meth:`wave` once per step, with whether requests
    wait in its scheduler where it knows, and :meth:`step_ended` after it. Its step clock also tells whether the
    engine resumed from idle lately (:attr:`warming`)."""

    def __init__(self):
        self.last_step_end = float("-inf")  # when the last step ended (perf_counter)
        self.draining: Optional[int] = None  # steps since a request ended with none joining after it
        self.burst = False  # the requests joining now began joining on an idle engine
        self.started_together = False  # the batch is such a burst, and nothing joined since
        self.steps_since_idle = 0  # steps since the last one that followed an idle gap
        self.waves = 0  # closed batches so far
        self._closed = False  # whether the last step's batch was closed
        self._requests: set = set()  # the last step's requests
        self.streamed = False  # a request has taken the place of one that ended while others ran on

    def wave(self, requests: list, remaining: Callable[[], torch.Tensor], joined: bool, ended: bool, began: float,
             waiting: bool = False) -> Optional["Wave"]:
        """The batch of ``requests`` as a :class:`Wave` (``remaining()``: their tokens left, read when the wave's are)
        when it is closed and runs more than one request, else None; ``began``: when this step began (perf_counter),
        and the rest as :meth:`closed` takes them. The engine was idle before this step when no step ran for
        :data:`IDLE_SECONDS`, or when none of the last step's requests runs in it and the engine was never refilled
        as a stream: the batch ran empty, however soon the next came (an offline loop's next list of prompts comes
        within milliseconds: stop 48, read as a refill, 0.69x no speculation at 16). A stream's batch runs empty too,
        where its requests all end in one step (drafting nothing, they end together): its refill is not a burst
        (stop 49, a benchmark keeping 4 requests in flight: read as bursts, closed, the budget drafted nothing where
        the chain ran 1.18x faster)."""
        gap = began - self.last_step_end > IDLE_SECONDS
        self.steps_since_idle = 0 if gap else self.steps_since_idle + 1
        running = set(requests)
        carried_on = not self._requests.isdisjoint(running)
        if joined and ended and carried_on and not gap and not running <= self._requests:
            self.streamed = True
        idle = gap or (joined and not carried_on and not self.streamed)
        self._requests = running
        closed = self.closed(joined, ended, idle, waiting)
        if closed and (not self._closed or (joined and idle)):  # a batch closes, or a burst follows one
            self.waves += 1
        self._closed = closed
        return Wave(requests, remaining, self.waves) if closed and len(requests) > 1 else None

    def step_ended(self, now: float) -> None:
        self.last_step_end = now

    @property
    def warming(self) -> bool:
        """Whether this step is one of the first :data:`WARM_STEPS` after an idle gap. On this kind of CPU machine the
        first steps after one run 1.5-4x slow (caches and clocks cold; worse after other processes ran), for ten to
        a few tens of steps: the budget does not read such a slow step as its shape's cost
        (:meth:`~eagle3_plugin.budget.TreeBudget.record`)."""
        return self.steps_since_idle < WARM_STEPS

    def closed(self, joined: bool, ended: bool, idle: bool, waiting: bool = False) -> bool:
        """``joined``: a request joined this step (or is still running its prompt); ``ended``: a request ended since
        the last step; ``idle``: the engine was idle before this step (see :meth:`wave`); ``waiting``: the
        engine's scheduler holds requests that will refill the batch (open, whatever came before)."""
        if waiting:
            self.burst = self.started_together = False
            self.draining = None
            return False
        if joined:
            self.burst = idle or (self.burst and not ended)
            self.started_together, self.draining = self.burst, None
        else:
            self.burst = False
            if self.draining is not None:
                self.draining += 1
            elif ended:
                self.draining = 0
        return self.started_together or (self.draining is not None and self.draining >= QUIET_STEPS)


class RequestAcceptance:
    """Each request's own acceptance (accepted draft tokens per round of the chain, tree rounds counted through the
    chain they contain), as a ratio to the recent mean over all requests: prompts differ far more than rounds of one
    prompt (stop 33: the hardest held-out prompt accepts 0.43 a round against a mean of 2.2). A request's own mean
    is shrunk toward the recent one by :data:`PRIOR_ROUNDS`; a request not drafted for yet stands for one of the
    recently ended requests (:data:`POOL_SIZE`), the batch's unknown requests spread over their quantiles."""

    def __init__(self):
        self.own: dict = {}  # request id -> [weighted accepted, weighted rounds, rounds]
        self.pool: deque = deque(maxlen=POOL_SIZE)  # ended requests' own means

    def observe(self, requests: list, accepted: torch.Tensor) -> None:
        """One round of each of ``requests``: ``accepted [R]`` chain tokens accepted."""
        for request, a in zip(requests, accepted.tolist()):
            total, weight, rounds = self.own.get(request, (0.0, 0.0, 0))
            self.own[request] = (REQUEST_MEMORY * total + a, REQUEST_MEMORY * weight + 1.0, rounds + 1)

    def forget(self, requests) -> None:
        """``requests`` ended: their means join the pool (those with :data:`POOL_ROUNDS` rounds)."""
        for request in requests:
            total, weight, rounds = self.own.pop(request, (0.0, 0.0, 0))
            if rounds >= POOL_ROUNDS:
                self.pool.append(total / weight)

    def ratios(self, requests: list, mean: float) -> torch.Tensor:
        """``[B]``: each request's expected acceptance over ``mean`` (the recent mean over all requests)."""
        if mean <= 0:
            return torch.ones(len(requests))
        ratios, unknown = [], []
        for row, request in enumerate(requests):
            total, weight, _ = self.own.get(request, (0.0, 0.0, 0))
            if weight:
                ratios.append((total + PRIOR_ROUNDS * mean) / ((weight + PRIOR_ROUNDS) * mean))
            else:
                ratios.append(1.0)
                unknown.append(row)
        ratio = torch.tensor(ratios)
        if unknown and len(self.pool) >= POOL_MIN:
            pool = torch.tensor(list(self.pool))
            quantiles = (torch.arange(len(unknown)) + 0.5) / len(unknown)
            spread = torch.quantile(pool, quantiles) / pool.mean().clamp(min=1e-9)
            ratio[torch.tensor(unknown)] = spread.float()
        return ratio


def wave_seconds(remaining: torch.Tensor, per_step: torch.Tensor, step_seconds: Callable[[int], float]) -> float:
    """Seconds until the last of a closed batch's requests ends: request ``r`` has ``remaining[r]`` tokens to go and
    gains ``per_step[r]`` a step, a step of ``b`` requests takes ``step_seconds(b)`` (read at powers of two and at
    the whole batch, and on straight lines between them: a choice at 32 requests reads 7 costs a shape, not 32)."""
    step_seconds = _on_grid(step_seconds, remaining.shape[0])
    finish = torch.ceil(remaining.double() / per_step.double().clamp(min=1.0)).sort().values.tolist()
    seconds, done, batch = 0.0, 0.0, len(finish)
    for ended, step in enumerate(finish):
        if step > done:  # steps done + 1 .. step run the requests not ended yet
            seconds += (step - done) * step_seconds(batch - ended)
            done = step
    return seconds


def _on_grid(step_seconds: Callable[[int], float], batch: int) -> Callable[[int], float]:
    grid = sorted({1 << i for i in range(batch.bit_length()) if 1 << i <= batch} | {batch})
    costs = [step_seconds(b) for b in grid]

    def read(b: int) -> float:
        i = bisect_left(grid, b)
        if grid[i] == b:
            return costs[i]
        low, high = grid[i - 1], grid[i]
        return costs[i - 1] + (costs[i] - costs[i - 1]) * (b - low) / (high - low)
    return read
