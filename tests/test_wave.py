"""Closed batches (``eagle3_plugin/wave.py``): a batch nothing joins is judged by when its last request ends, each
request moving at its own acceptance, not by tokens per step."""

import pytest
import torch

from eagle3_plugin.budget import NONE, TreeBudget
from eagle3_plugin.budget_estimates import STALE_STEPS, Line
from eagle3_plugin.wave import (IDLE_SECONDS, POOL_MIN, POOL_ROUNDS, PRIOR_ROUNDS, QUIET_STEPS, WARM_STEPS, QuietBatch,
                                RequestAcceptance, Wave, wave_seconds)
from test_budget import CONFIG, fitted, seed_acceptance


def test_a_batch_is_closed_when_its_requests_joined_together_on_an_idle_engine_or_it_drains():
    burst = QuietBatch()  # prompts joining an idle engine, over two steps of prompt chunks
    assert burst.closed(True, False, idle=True) and burst.closed(True, False, idle=False)
    assert burst.closed(False, True, idle=False)  # it drains: still closed
    assert not burst.closed(True, True, idle=False)  # requests that end are replaced: a stream's refill
    steps = [burst.closed(False, False, idle=False) for _ in range(QUIET_STEPS)]
    assert not any(steps)  # nothing ended: a full batch whose requests would be replaced
    steps = [burst.closed(False, ended, idle=False) for ended in [True] + [False] * QUIET_STEPS]
    assert steps == [False] * QUIET_STEPS + [True]  # a request ended, and none joined in as many steps: it drains
    queued = QuietBatch()  # more requests wait in the engine's scheduler: they refill the batch as requests end
    assert not queued.closed(True, False, idle=True, waiting=True)
    assert not any(queued.closed(False, True, idle=False, waiting=True) for _ in range(2 * QUIET_STEPS))


def test_a_wave_lasts_until_its_last_request_ends_over_ever_smaller_steps():
    cost = {3: 0.030, 2: 0.020, 1: 0.010}
    # ends after 2, 2 and 5 steps (5 tokens at 1 a step): 2 steps of 3 requests, then 3 of 1
    seconds = wave_seconds(torch.tensor([4, 6, 5]), torch.tensor([2.0, 3.0, 1.0]), cost.__getitem__)
    assert seconds == pytest.approx(2 * 0.030 + 3 * 0.010)


def test_a_request_is_read_at_its_own_acceptance_shrunk_toward_the_mean():
    acceptance = RequestAcceptance()
    acceptance.observe(["easy", "hard"], torch.tensor([4, 0]))
    ratios = acceptance.ratios(["easy", "hard", "new"], mean=2.0)
    assert ratios.tolist() == pytest.approx([(4 + PRIOR_ROUNDS * 2) / ((1 + PRIOR_ROUNDS) * 2),
                                             PRIOR_ROUNDS / (1 + PRIOR_ROUNDS), 1.0])


def test_requests_not_drafted_for_yet_stand_for_the_spread_of_those_that_ended():
    acceptance = RequestAcceptance()
    ended = [f"r{i}" for i in range(POOL_MIN)]
    for _ in range(POOL_ROUNDS):
        acceptance.observe(ended, torch.tensor([0, 1, 2, 3, 3, 4, 5, 6][:POOL_MIN]))
    acceptance.forget(ended + ["never drafted"])
    assert len(acceptance.pool) == POOL_MIN
    ratios = acceptance.ratios(["a", "b"], mean=3.0)  # unknown: the pool's quartiles over its mean
    pool = torch.tensor(list(acceptance.pool))
    assert ratios.tolist() == pytest.approx((torch.quantile(pool, torch.tensor([0.25, 0.75])) / pool.mean()).tolist())


def closed_wave_budget(spread: bool):
    """Batch 32, each step costing 10 ms without speculation and 28 ms with the chain (accepting 2.3 a round on
    average): a step alone favours the chain, 32 x 3.3 / 28 ms against 32 / 10 ms (1.18x). ``spread``: ended requests
    accepted from 0.3 to 4.3 a round (those of a wave do too); otherwise all alike."""
    budget = TreeBudget(CONFIG, {s: Line(0.0) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    budget.verify_cost = {tree: fitted(0.100, 0.0), chain: fitted(0.0005, 0.0008625), NONE: fitted(0.002, 0.00025)}
    seed_acceptance(budget, tree=2.3, chain=2.3)
    ended = [f"ended{i}" for i in range(32)]
    per_request = torch.linspace(0.3, 4.3, 32) if spread else torch.full((32,), 2.3)
    for _ in range(POOL_ROUNDS):
        budget.request_accepted.observe(ended, per_request)
    budget.finished(ended)
    return budget, chain


@pytest.mark.parametrize("spread", [True, False])
def test_a_closed_batch_whose_requests_accept_unevenly_drafts_nothing_where_a_step_alone_would_draft(spread):
    budget, chain = closed_wave_budget(spread)
    wave = Wave([f"new{i}" for i in range(32)], lambda: torch.full((32,), 96))
    assert budget.tokens_per_second(chain, 32) > 1.1 * budget.tokens_per_second(NONE, 32)
    assert budget.shape(32) == chain  # a stream of requests: each step judged alone
    # closed: with the spread, the hardest requests drain over chain steps few requests share; alike, all end together
    assert budget.shape(32, wave=wave) == (NONE if spread else chain)


def test_a_closed_batch_starts_no_probe_of_a_shape_that_drafts():
    """A probe's few steps of the chain would spread the ends of the whole wave: it waits for a batch that is open.
    Nor is a shape probed there because its acceptance mean started afresh: its few fresh rounds are read."""
    budget, chain = closed_wave_budget(spread=True)
    budget.last_run[chain] = -10 ** 6  # long due
    budget.accepted[chain].observe(torch.tensor([2.3]), budget.steps + STALE_STEPS + 1)  # starts afresh: one round
    wave = Wave([f"new{i}" for i in range(32)], lambda: torch.full((32,), 96))
    assert budget.shape(32, wave=wave) == NONE and budget.last_probe[chain] < 0
    assert budget.shape(32) == chain and budget.last_probe[chain] == budget.steps


def test_a_closed_batch_that_follows_another_at_once_is_judged_afresh():
    """The drain estimate is kept for 8 steps, but not into the next closed batch: here one of requests that accept
    unevenly (nothing drafted) is followed at the next step by one whose requests accept alike (the chain)."""
    budget, chain = closed_wave_budget(spread=True)
    alike = [f"alike{i}" for i in range(32)]
    for _ in range(30):
        budget.request_accepted.observe(alike, torch.full((32,), 2.3))
    uneven = Wave([f"new{i}" for i in range(32)], lambda: torch.full((32,), 96), number=1)
    assert budget.shape(32, wave=uneven) == NONE
    assert budget.shape(32, wave=Wave(alike, lambda: torch.full((32,), 96), number=2)) == chain


def test_closed_batches_are_numbered():
    quiet, now, numbers = QuietBatch(), 100.0, []
    steps = [(True, False, 1.0)] + [(False, False, 0.01)] * 3  # a burst on an idle engine, then its steps
    steps += [(True, False, 1.0)]  # the next burst right after (a new list of prompts)
    steps += [(True, True, 0.01)] + [(False, False, 0.01)] * 3  # a refill: open
    steps += [(False, True, 0.01)] + [(False, False, 0.01)] * QUIET_STEPS  # a request ends, none joins: it drains
    for joined, ended, gap in steps:
        now += gap
        wave = quiet.wave(["a", "b"], lambda: torch.tensor([9, 9]), joined=joined, ended=ended, began=now)
        numbers.append(None if wave is None else wave.number)
        quiet.step_ended(now)
    assert numbers == [1] * 4 + [2] + [None] * 4 + [None] * QUIET_STEPS + [3]


class Steps:
    """Steps of ``quiet``, each 10 ms after the last (never an idle gap unless :meth:`idle`)."""

    def __init__(self, quiet: QuietBatch):
        self.quiet, self.now = quiet, 100.0

    def __call__(self, requests, joined, ended):
        self.now += 0.01
        wave = self.quiet.wave(requests, lambda: torch.full((len(requests),), 9), joined=joined, ended=ended,
                               began=self.now)
        self.quiet.step_ended(self.now)
        return wave

    def idle(self, seconds: float) -> None:
        self.now += seconds


def test_a_batch_that_ran_empty_and_fills_again_at_once_is_a_burst():
    """An offline loop's next list of prompts comes within milliseconds of the last step of the one before, but none of
    that step's requests runs in it: the engine was idle, and the new batch is closed (a new one); requests joining
    where some of the last step's still run are a refill (open)."""
    step = Steps(QuietBatch())
    first = step(["a", "b"], joined=True, ended=False)
    assert step(["a", "b"], joined=False, ended=False).number == first.number
    second = step(["c", "d"], joined=True, ended=True)  # a and b ended, c and d joined: the batch ran empty
    assert second is not None and second.number == first.number + 1
    assert step(["c", "e"], joined=True, ended=True) is None  # d ended, e joined beside c: a refill


def test_a_stream_whose_batch_ran_empty_and_fills_again_at_once_stays_open():
    """Once a request has taken an ended one's place while others ran on, the engine is fed as a stream: a batch whose
    requests all ended in one step (as they do when nothing is drafted) and that fills again at once is a refill, not
    a burst. Requests joining over two steps of one burst (no request ended) are no such evidence."""
    quiet = QuietBatch()
    step = Steps(quiet)
    assert step(["a", "b"], joined=True, ended=False) is not None  # the first burst
    assert step(["a", "b", "c"], joined=True, ended=False) is not None  # c admitted a step later: the same burst
    assert not quiet.streamed
    assert step(["d", "e", "f"], joined=True, ended=True) is not None  # all ended, three joined at once: a burst
    assert step(["d", "e", "g"], joined=True, ended=True) is None  # f ended, g took its place: a refill
    assert quiet.streamed
    assert step(["h", "i", "j"], joined=True, ended=True) is None  # all ended, three joined at once: a refill now
    step.idle(1.0)  # whatever joins next is a burst
    assert step(["k", "l"], joined=True, ended=True) is not None


def test_a_shim_gets_a_wave_only_for_a_closed_batch_of_more_than_one_request():
    """:meth:`QuietBatch.wave` reads the engine idle from the gap since :meth:`QuietBatch.step_ended`, and the
    requests' tokens left only when a wave it returned is asked for them, once."""
    quiet, read = QuietBatch(), []

    def remaining():
        read.append(True)
        return torch.tensor([5, 7])

    wave = quiet.wave(["a", "b"], remaining, joined=True, ended=False, began=100.0)  # no step before: idle
    assert wave is not None and wave.requests == ["a", "b"] and not read
    assert wave.remaining.tolist() == [5, 7] and wave.remaining.tolist() == [5, 7] and len(read) == 1
    quiet.step_ended(100.01)
    assert quiet.wave(["a"], remaining, joined=False, ended=False, began=100.02) is None and len(read) == 1
    quiet.step_ended(100.03)
    refill = quiet.wave(["a", "c"], remaining, joined=True, ended=True, began=100.03 + IDLE_SECONDS / 2)
    assert refill is None and len(read) == 1  # a request joined where one just ended, the engine busy: open


def test_the_first_steps_after_an_idle_gap_are_warming():
    """:attr:`QuietBatch.warming` holds for :data:`WARM_STEPS` steps from the first one and from each that follows an
    idle gap; a client's quick next request (a gap under :data:`IDLE_SECONDS`) does not start it again."""
    quiet, now, warming = QuietBatch(), 100.0, []
    for step in range(3 * WARM_STEPS):
        now += {WARM_STEPS + 10: 5.0, WARM_STEPS + 5: IDLE_SECONDS / 2}.get(step, 0.001)
        quiet.wave(["a"], lambda: torch.tensor([9]), joined=False, ended=False, began=now)
        warming.append(quiet.warming)
        now += 0.01
        quiet.step_ended(now)
    assert warming == [True] * WARM_STEPS + [False] * 10 + [True] * WARM_STEPS + [False] * (WARM_STEPS - 10)
