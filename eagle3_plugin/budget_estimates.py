"""The auto budget's running estimates (:mod:`eagle3_plugin.budget`): a step's cost as a line in the batch size,
accepted tokens as a mean over recent request-rounds, how deep the chain gets, and the draft's cost per shape
measured at start-up."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from .sampler import SamplingParams
from .speculator import DraftKV, DraftRows, Speculator, TreeShape

FORGET = 0.95  # weight of the past per observation in the online cost fits
MIN_OBSERVATIONS = 3  # observations of a cost (in a batch size's bucket) before it is believed (later ones clipped)
ROUND_MEMORY = 0.99  # weight of the past per request-round in the acceptance means (about the last 100)
OUTLIER = 2.0  # an observed cost counts at most this many times its fit (a step slowed by something else)
COVERED = 0.3  # weight of recent observations in a batch size's bucket for a cost line to be read there
STALE_STEPS = 50  # steps after which an unfed acceptance mean, or an unrun shape's costs, are stale


@dataclass
class Line:
    """``seconds = fixed + per_unit * units``, fitted by recursive least squares with forgetting. Once fitted, an
    observation counts at most :data:`OUTLIER` times the fit: a step another process slowed moves it by little,
    while a cost that truly grew is followed within a hundred observations.

    A step's cost is not quite a line in the batch size, and a fit over batches 5 to 32 can read twice the true cost
    at batch 1. So where :data:`MIN_OBSERVATIONS` recent observations lie within a factor of 2 of ``units`` (its
    power-of-two bucket, :meth:`covers`), the line is read through their mean (the bucket's centroid): ``seconds =
    mean_seconds_there + slope * (units - mean_units_there)``, ``slope`` the fit's ``per_unit`` but at most the mean
    seconds per unit there (a unit never costs more than the mean one: a fit over steps at 15 and 16 requests alone
    can read any slope). Where ``units``' own bucket is not covered, the line is read the same way through a
    neighbouring bucket's centroid, and only where neither neighbour is covered does it extrapolate the fit. Between
    the centroids of two neighbouring covered buckets it is read on the straight line through them instead, so the
    reading does not jump where ``units`` crosses into the next bucket (run S2 at ~16 requests: the chain's cost read
    13.1 ms at 15 requests and 17.6 ms at 16, from two buckets' observations, and the budget alternated the chain and
    no speculation as the batch moved between 15 and 16).

    A bucket holding fewer observations, or only old ones, is not covered, and the budget probes a shape there. One
    step is not enough: in run U3 no speculation's bucket at 16 was dropped as stale, and the one step observed there
    next, a slow one (15 ms against ~10 at 15), was read as its cost from 16 requests up, so the budget drafted the
    chain at 16 and nothing at 15 for the rest of the pass (a stale bucket is now read at today's speed until fresh
    steps replace it, :meth:`forget_near`). Nor are old ones: the steps at 2 or 3 requests an engine's start-up
    drained through, slow as first steps are, read 9.7 ms for a 3.4 ms step at one (run T), and, as they covered it,
    kept it from being probed there for ~600 steps."""

    fixed: float = 0.0
    per_unit: float = 0.0
    observations: int = 0
    _stats: list = field(default_factory=lambda: [0.0] * 5)  # weighted n, sum x, sum y, sum xx, sum xy
    # power-of-two bucket of units -> [weighted n, sum x, sum y, observations] in it
    _near: dict = field(default_factory=dict)
    _fresh: dict = field(default_factory=dict)  # the same, for buckets being observed afresh (forget_near)

    def __call__(self, units: float) -> float:
        bucket = _bucket(units)
        here = self._centroid(bucket)
        if here is None:
            neighbours = [c for c in (self._centroid(bucket - 1), self._centroid(bucket + 1)) if c is not None]
            if not neighbours:
                return self.fixed + self.per_unit * units
            here = min(neighbours, key=lambda c: _ratio_apart(c[0], units))
        x, y = here
        there = None if units == x else self._centroid(_bucket(x) + (1 if units > x else -1))
        if there is not None and (there[0] - units) * (units - x) > 0:  # between the two centroids
            return y + (there[1] - y) * (units - x) / (there[0] - x)
        return y + min(self.per_unit, y / x) * (units - x)  # a unit never costs more than the mean one there

    def observe(self, units: float, seconds: float) -> None:
        fit = self(units)
        if self.observations >= MIN_OBSERVATIONS and fit > 0:
            seconds = min(seconds, OUTLIER * fit)
        n, sx, sy, sxx, sxy = (FORGET * v for v in self._stats)
        self._stats = [n + 1, sx + units, sy + seconds, sxx + units * units, sxy + units * seconds]
        self._near, self._fresh = _forgotten(self._near), _forgotten(self._fresh)
        bucket = _bucket(units)
        near = (self._fresh if bucket in self._fresh else self._near).setdefault(bucket, [0.0, 0.0, 0.0, 0])
        near[0], near[1], near[2], near[3] = near[0] + 1.0, near[1] + units, near[2] + seconds, near[3] + 1
        if bucket in self._fresh and near[3] >= MIN_OBSERVATIONS:
            self._near[bucket] = self._fresh.pop(bucket)
        n, sx, sy, sxx, sxy = self._stats
        self.observations += 1
        spread = sxx - sx * sx / n
        if spread > 1e-6 * max(sxx, 1.0):
            self.per_unit = max((sxy - sx * sy / n) / spread, 0.0)
        self.fixed = max(sy / n - self.per_unit * sx / n, 0.0)

    def copy(self) -> "Line":
        return self.scaled(1.0)

    def scaled(self, factor: float) -> "Line":
        """A copy that reads every cost ``factor`` times this line's."""
        n, sx, sy, sxx, sxy = self._stats
        near, fresh = ({b: [m, x, factor * y, count] for b, (m, x, y, count) in buckets.items()}
                       for buckets in (self._near, self._fresh))
        stats = [n, sx, factor * sy, sxx, factor * sxy]
        return Line(factor * self.fixed, factor * self.per_unit, self.observations, stats, near, fresh)

    def covers(self, units: float) -> bool:
        """Whether ``units``' bucket (within a factor of 2) holds :data:`MIN_OBSERVATIONS` observations and they still
        weigh :data:`COVERED` in the fit."""
        return self._covered(_bucket(units))

    def forget_near(self, units: float, today: float = 1.0) -> None:
        """Read ``units``' bucket from the next observations there alone, once :data:`MIN_OBSERVATIONS` of them are in:
        its observations are stale (the shape has not run for a while, and the machine's speed has moved since). Until
        then they are read ``today`` times what they read (how much slower the machine runs now, as the budget's drift
        reads it): in run V one step at 32 after the bucket was dropped left it uncovered, no speculation's cost there
        was read off the bucket below (11.4 ms against the 7.8 just read), and the chain was drafted through the rest
        of the pass, at 0.63x no speculation."""
        bucket = _bucket(units)
        if bucket in self._near:
            self._near[bucket][2] *= today
        self._fresh[bucket] = [0.0, 0.0, 0.0, 0]

    def floor(self, units: float, below: bool = False) -> Optional[float]:
        """A lower bound on the cost at ``units``, the larger of two (None when neither exists): the line at the bottom
        of the highest covered bucket at or below ``units`` (``below``: below ``units``' own bucket; more units never
        cost less), and, but with ``below``, the line at the bottom of the lowest covered bucket above, scaled down in
        proportion to the units (batching never makes a unit dearer: ``fixed + per_unit * units`` with ``fixed >= 0``
        falls no faster than the units)."""
        lower = next((b for b in range(_bucket(units) - below, 0, -1) if self._covered(b)), None)
        bounds = [] if lower is None else [self(1 << (lower - 1))]
        above = None if below else self._above(units)
        if above is not None:
            bounds.append(above[1] * units / above[0])
        return max(bounds) if bounds else None

    def ceiling(self, units: float) -> Optional[float]:
        """An upper bound on the cost at ``units``: the line there where it :meth:`covers` it, else at the bottom of the
        lowest covered bucket above (more units never cost less); None when there is none."""
        if self.covers(units):
            return self(units)
        above = self._above(units)
        return None if above is None else above[1]

    def _covered(self, bucket: int) -> bool:
        weight, _, _, count = self._near.get(bucket, (0.0, 0.0, 0.0, 0))
        return weight >= COVERED and count >= MIN_OBSERVATIONS

    def _centroid(self, bucket: int) -> Optional[tuple[float, float]]:
        """The mean units and seconds of a covered bucket's observations; None where it is not covered."""
        if not self._covered(bucket):
            return None
        n, sx, sy, _ = self._near[bucket]
        return sx / n, sy / n

    def _above(self, units: float) -> Optional[tuple[int, float]]:
        """The units at the bottom of the lowest covered bucket above ``units``' own, and the line there; or None."""
        b = min((b for b in self._near if b > _bucket(units) and self._covered(b)), default=None)
        return None if b is None else (1 << (b - 1), self(1 << (b - 1)))


def _forgotten(buckets: dict) -> dict:
    """``buckets``' weighted sums after one more observation (their counts are kept)."""
    return {b: [FORGET * n, FORGET * x, FORGET * y, count] for b, (n, x, y, count) in buckets.items()}


def _ratio_apart(a: float, b: float) -> float:
    """How far apart two batch sizes are, as a ratio (1: the same): nearness in a power-of-two bucketing."""
    return max(a / b, b / a)


def _bucket(units: float) -> int:
    return int(max(units, 1.0)).bit_length()


def nearest_covered(units: int, *lines: Line) -> Optional[int]:
    """``units`` where every line :meth:`~Line.covers` it, else the nearer (in ratio) of the two just outside its
    power-of-two bucket, above and below, that every line covers; None where there is none."""
    units, bucket = max(units, 1), _bucket(units)
    outside = [b for b in (1 << bucket, (1 << (bucket - 1)) - 1) if b >= 1]
    candidates = [units] + sorted(outside, key=lambda b: _ratio_apart(b, units))
    return next((b for b in candidates if all(line.covers(b) for line in lines)), None)


@dataclass
class RoundMean:
    """Mean accepted draft tokens per request-round, with forgetting: ``value`` (None before any round). Acceptance
    is a property of the prompts in flight: a mean not fed for :data:`STALE_STEPS` steps was taken on prompts that
    have likely gone (a hard tail of the last batch), and starts afresh at its next round (``rounds`` back to 0, so
    the budget probes its shape until :data:`MIN_ROUNDS` fresh rounds back it)."""

    total: float = 0.0
    weight: float = 0.0
    rounds: int = 0
    last_step: int = 0

    @property
    def value(self) -> Optional[float]:
        return self.total / self.weight if self.weight else None

    def observe(self, accepted: torch.Tensor, step: int) -> None:
        """Step ``step``'s rounds: ``accepted [R]`` draft tokens accepted by each request."""
        if step - self.last_step > STALE_STEPS:
            self.total = self.weight = self.rounds = 0
        decay = ROUND_MEMORY ** accepted.numel()
        self.total = decay * self.total + float(accepted.float().sum())
        self.weight = decay * self.weight + accepted.numel()
        self.rounds += accepted.numel()
        self.last_step = step


class ChainDepths:
    """How deep the chain gets: for each depth ``j``, of the recent request-rounds whose chain accepted its first
    ``j - 1`` nodes and held a node at depth ``j``, the share that accepted it (forgotten as :class:`RoundMean`).

    A wide tree holds its chain only to some depth (its deepest first children lose to other branches), so what
    the chain accepted inside a tree's round stops short where the chain alone would have gone on; counted as is,
    it makes the tree look better than its chain by what is cut off. :meth:`completed` adds what the chain is
    expected to accept past the depth it was held to, from these shares."""

    def __init__(self, depth: int):
        self.depth = depth
        self.reached = torch.zeros(depth, dtype=torch.float64)
        self.passed = torch.zeros(depth, dtype=torch.float64)

    def observe(self, accepted: torch.Tensor, held: torch.Tensor) -> None:
        """``accepted [R]``: chain nodes each request-round accepted; ``held [R]``: the depth its chain reached."""
        j = torch.arange(1, self.depth + 1)
        seen = j[None] <= held.cpu()[:, None]
        accepted = accepted.cpu()[:, None]
        decay = ROUND_MEMORY ** accepted.shape[0]
        self.reached = decay * self.reached + (seen & (accepted >= j - 1)).sum(0)
        self.passed = decay * self.passed + (seen & (accepted >= j)).sum(0)

    def completed(self, accepted: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
        """``accepted``, plus, in rounds that accepted the whole chain they held short of full depth, what the chain
        is expected to accept past it (0 where no round has shown a depth yet)."""
        share = (self.passed / self.reached.clamp(min=1e-9)).tolist()
        beyond = [0.0] * (self.depth + 1)  # beyond[h]: expected nodes accepted past depth h, having accepted to h
        for h in reversed(range(self.depth)):
            beyond[h] = share[h] * (1.0 + beyond[h + 1])
        cut = (accepted == held) & (held < self.depth)
        return accepted + cut * torch.tensor(beyond, dtype=torch.float32, device=held.device)[held]


@torch.inference_mode()
def measure_draft_costs(speculator: Speculator, shapes, feature_size: int, dtype, device,
                        batches=(1, 8), context: int = 256, repeats: int = 3) -> dict[TreeShape, Line]:
    """Seconds per speculator step for each shape, a line in the batch size, on synthetic rows (random features,
    ``context`` stored positions, one new entry per row: a decode step). Nothing of them stays deferred."""
    c = speculator.draft.config
    biggest = max(batches)
    kv = DraftKV.allocate(biggest * (context + 1), c.num_key_value_heads, c.head_dim, dtype, device)
    slots = torch.arange(biggest * (context + 1), device=device).view(biggest, context + 1)
    out = {}
    for shape in shapes:
        seconds = []
        for b in batches:
            rows = DraftRows(slots[:b], torch.full((b,), context, device=device),
                             torch.ones(b, dtype=torch.long, device=device),
                             torch.randint(c.vocab_size, (b, 1), device=device),
                             torch.randn(b, 1, feature_size, dtype=dtype, device=device))
            params = SamplingParams.uniform(b, device=device)
            timings = []
            for _ in range(repeats + 1):
                began = time.perf_counter()
                speculator.step(kv, rows, params, shape=shape)
                timings.append(time.perf_counter() - began)
            seconds.append(min(timings[1:]))
        per_row = max((seconds[-1] - seconds[0]) / (batches[-1] - batches[0]), 0.0) if len(batches) > 1 else 0.0
        out[shape] = Line(max(seconds[0] - per_row * batches[0], 0.0), per_row)
    speculator.flush()
    return out
