"""How much to speculate in a step: the tree shape that maximises expected tokens per second for the step's load.

Speculation pays when the tokens a round accepts are worth more than what the round costs: with ``B`` requests in
a step, shape ``s`` is worth

    B * (1 + accepted_s) / (verify_s(B) + draft_s(B))

tokens per second, ``s = none`` (no speculation) being worth ``B / (verify_none(B) + draft_none(B))``. At batch 1
a step costs about the same for 1 or 32 tokens and the biggest tree wins; under load the target's forward grows
with every node verified, the tree shrinks toward a chain and then to no speculation. The engines call
:meth:`TreeBudget.shape` before drafting and :meth:`TreeBudget.record` after each step. Costs and acceptance are
measured, never assumed:

- ``draft_s(B)``: seconds of the core speculator per step for each shape (for none: the draft's catch-up alone),
  measured at start-up on synthetic rows (:func:`measure_draft_costs`, a line in ``B``), then scaled online by
  what drafting really took;
- ``verify_s(B)``: the rest of a step that verifies shape ``s`` (the target's forward over ``B`` trees, tree
  attention, verification, the engine's own work: a step runs from its start to the next step's start,
  :class:`PendingRecord`), a line in ``B`` per shape, fitted online on steps without prompt chunks (recursive least
  squares with forgetting) and read, near the batch sizes it was observed at, through the observations there
  (:class:`Line`). Both are read at today's speed: a shape not being run is costed at what it was measured times
  how much the shape being run has slowed since (:meth:`TreeBudget.drift`), so a shape run in a slow spell is not
  compared with shapes last run in a fast one;
- ``accepted_s``: accepted draft tokens per request per round, a mean over recent request-rounds (each request's
  round weighs alike, whatever the batch), started afresh when it was not fed for a while (the prompts it was
  taken on have gone, :class:`RoundMean`); rounds of a tree also tell what its chain would have accepted (the
  first child at each level is the chain's node). Acceptance varies from prompt to prompt far more than between
  shapes, so the tree is judged on the same rounds as the chain: its expected acceptance is the chain's recent
  mean raised by what the tree gained over its chain in the tree's own rounds (means taken on different prompts
  would favour whichever shape ran on the easier ones; :meth:`TreeBudget.expected_accepted`); where a wide tree
  held its chain short of full depth and the chain accepted all of it, the chain is credited what it accepts past
  there (:class:`ChainDepths`).

The ladder of shapes is the configured tree, the chain of its depth, and none. A bigger shape is chosen over a
smaller one only when it is expected to be :data:`MARGIN` faster: the estimates move by tens of percent with the
prompts, and speculating has a cost a step's estimate does not see (requests that would have ended together finish
at different steps, and the batch drains over a tail of small steps). Once chosen, a shape is kept while it is
expected to be faster at all (a switch has costs of its own: a step after some that drafted nothing first stores
their entries), so estimates near the margin do not make the budget alternate. Those costs are not read as either
shape's: a step is a cost observation only when it verified and drafted the shape its previous step verified (run
Y at 16 requests: the first step without drafts after the chain's took 4.4 ms, the step back to the chain 3.6 ms,
the steps between 2.4 ms, so a three-step probe read no speculation 1.5x dear and the chain was kept where it
lost). A shape with too few measurements (:data:`MIN_ROUNDS` request-rounds since its mean last started afresh: one
round of one request says little), not run for a while, or whose cost was not measured at about this batch size (a line
fitted at batch 1 and 4 says little about batch 32) unless it would lose there even at the cost it was measured at for
fewer requests, or for more scaled down by the load, is probed (:data:`PROBE_STEPS` steps in a row, and on until its
mean holds :data:`MIN_ROUNDS` rounds; no speculation's, on until its cost is read there); a shape that drafts, probed
and still not chosen, waits twice as long for its next probe (up to :data:`PROBE_EVERY_MAX` steps), and is not probed
at a batch size where it would lose even at its cost for half as many requests or at the cost of a shape verifying fewer
tokens, so a tree that loses under load is not paid for every few hundred steps, while no speculation, whose probe
costs a few steps' drafts, is probed every :data:`PROBE_EVERY` steps; nor is a shape whose acceptance mean started
afresh run to refill it where it would lose even accepting its whole depth every round. The costs of a shape not run for
:data:`STALE_STEPS` steps are stale at the batch size it is next run at (its last probe there may have hit a slow
spell the drift did not see): once a few of its new steps there are in, they are read alone (until then, the stale
ones at today's speed).
A closed batch (:mod:`.wave`: its requests joined together on an idle engine, or it drains, nothing replacing the
requests that end) is judged by when its last request ends instead: each shape's tokens per second are scaled by the
share a step's rate keeps over the batch's drain, each request moving at its own acceptance; there, no probe of a shape
that drafts starts (its steps would spread the ends of the whole batch), and a shape whose acceptance mean started
afresh is read from its few fresh rounds.
``budget: "fixed"`` always drafts the configured tree, and so does a step with a seeded request (the draws a round
makes depend on its shape). ``EAGLE3_BUDGET_LOG=PATH`` makes an auto budget log why it chose what it chose
(:class:`~eagle3_plugin.budget_log.BudgetLog`).
"""

from __future__ import annotations

from typing import Optional

import torch

from .budget_estimates import (MIN_OBSERVATIONS, OUTLIER, STALE_STEPS, ChainDepths, Line, RoundMean,
                               measure_draft_costs, nearest_covered)
from .budget_log import BudgetLog
from .config import Eagle3Config
from .sampler import Verdict
from .speculator import Speculator, TreeShape
from .tree import DraftTree
from .wave import RequestAcceptance, Wave, wave_seconds

NONE = TreeShape(1, 1, 1)
# Steps between probes of a shape that is not being run (doubled after each probe, up to the max).
PROBE_EVERY = 4 * STALE_STEPS
PROBE_EVERY_MAX = 3200
PROBE_STEPS = 5  # steps a probe drafts its shape: its first verified step and the step back are not read (see record)
PROBE_STEPS_MAX = 4 * PROBE_STEPS  # steps a probe of no speculation goes on while its cost is unread (_probe_unread)
MIN_ROUNDS = 24  # request-rounds before a shape's acceptance is trusted
MARGIN = 1.1  # expected tokens/s a bigger shape must reach over a smaller one to be chosen
WAVE_EVERY = 8  # steps between readings of a closed batch's drain (_wave_factor)
MAX_DRIFT = OUTLIER ** 2  # the most the machine is read to have slowed down (or sped up) since a shape last ran
WARM_SLOW = 1.3  # a step just after the engine idled, this much slower than expected, is not a cost observation


class TreeBudget:
    def __init__(self, config: Eagle3Config, draft_costs: Optional[dict] = None):
        """``draft_costs``: :func:`measure_draft_costs` of the shapes in :attr:`shapes` (none: drafting counts 0)."""
        tree = TreeShape.of(config)
        chain = TreeShape(config.depth, 1, config.depth + 1)
        self.shapes = [tree] + ([chain] if chain != tree else []) + [NONE]
        self.chain = chain if chain != tree else None  # the tree's chain, when it is a shape of its own
        self.auto = config.budget == "auto"
        self.draft_costs = draft_costs or {}
        self.draft_scale = {s: 1.0 for s in self.shapes}  # observed / measured draft seconds
        self.verify_cost = {s: Line() for s in self.shapes}
        # For each shape, the other shapes' cost lines as they stood when its cost was last observed (see drift).
        self.lines_when_seen: dict = {s: {} for s in self.shapes}
        self.accepted = {s: RoundMean() for s in self.shapes if s != NONE}  # per request-round
        self.chain_in_tree = RoundMean()  # what the tree's chain accepted, in the tree's rounds only (completed)
        self.chain_depths = ChainDepths(config.depth)
        self.request_accepted = RequestAcceptance()  # each request's own, for closed batches (:mod:`.wave`)
        self._wave_factors: dict = {}  # shape -> (step, wave number, its _wave_factor then): the last closed batch's
        self.last_run = {s: 0 for s in self.shapes}
        self.last_observed = {s: 0 for s in self.shapes}  # the last step whose cost a shape's line observed
        self.probe_left = {s: 0 for s in self.shapes}  # steps left of a probe under way
        self.last_probe = {s: -PROBE_EVERY for s in self.shapes}  # when a probe last began
        self.probe_batch = {s: 1 for s in self.shapes}  # at how many requests it began
        self.probe_every = {s: PROBE_EVERY for s in self.shapes}  # steps not run before a probe, doubled per probe
        self.current = NONE  # the shape chosen last on merit (not a probe)
        self.reference = NONE  # the shape whose cost line the drift is read off (see drift)
        self.reference_line: Optional[Line] = None  # its line when another shape was chosen, until the hand-over
        self.last_verified: Optional[TreeShape] = None  # the shape the last recorded step verified
        self.steps = 0
        self.log = BudgetLog.from_env() if self.auto else None
        self._memo: Optional[dict] = None  # during one choice: estimates read more than once (nothing changes then)

    @classmethod
    def for_speculator(cls, speculator: Speculator, dtype, device) -> "TreeBudget":
        """The budget of ``speculator``'s config; with ``budget: "auto"``, the draft's cost per shape measured here,
        once (an engine calls this at start-up)."""
        budget = cls(speculator.config)
        if budget.auto:
            budget.draft_costs = measure_draft_costs(speculator, budget.shapes, speculator.draft.fc.in_features,
                                                     dtype, device)
        return budget

    def shape(self, batch: int, seeded: bool = False, wave: Optional[Wave] = None,
              chains_only: bool = False) -> TreeShape:
        """The shape to draft for ``batch`` requests this step; ``wave``: the batch is closed, and shapes are judged
        by when its last request ends (:meth:`wave_tokens_per_second`). A batch with a seeded request gets the
        configured tree: a seeded request repeats its output only when its rounds always draft the same shape.
        ``chains_only``: every request verifies a chain only (vLLM's grammars: a tree would be cut to its leading
        path, which the tree's chain drafts alone, at a chain's cost), so only chains and no speculation are chosen
        from (a fixed budget drafts the tree's chain)."""
        self.steps += 1
        self._memo = {}
        try:
            shape = self._choose(batch, seeded, wave, chains_only)
        finally:
            self._memo = None
        if self.log is not None:
            self.log.write(self, batch, shape, wave)
        return shape

    def _choose(self, batch: int, seeded: bool, wave: Optional[Wave], chains_only: bool) -> TreeShape:
        if seeded:
            return self.shapes[0]
        shapes = [s for s in self.shapes if s.top_k == 1] if chains_only else self.shapes
        if not self.auto:
            return shapes[0]
        for s in shapes:  # too few measurements, not run for a while, or not at this load: probe it
            cost = self.verify_cost[s]
            # (a shape still gathering its first observations is being run already)
            unmeasured_here = cost.observations >= MIN_OBSERVATIONS and not cost.covers(batch)
            # a closed batch starts no probe of a shape that drafts: it would spread the ends of the whole wave
            starts = wave is None or s == NONE
            due = starts and self.steps - self.last_run[s] > self.probe_every[s] and (
                s == NONE or not self.would_lose(s, batch, below=True, shapes=shapes))
            if due or (starts and unmeasured_here and self.steps - self.last_probe[s] > STALE_STEPS
                       and not self.would_lose(s, batch, shapes=shapes)):
                self.probe_left[s], self.last_run[s], self.last_probe[s] = PROBE_STEPS, self.steps, self.steps
                self.probe_batch[s] = batch
                if s != NONE:  # a probe of no speculation costs a few steps' drafts, and keeps its cost current
                    self.probe_every[s] = min(2 * self.probe_every[s], PROBE_EVERY_MAX)
            if self.probe_left[s] > 0 or not self._measured(s, min_rounds=MIN_ROUNDS if starts else 1):
                if s != NONE and batch > 2 * self.probe_batch[s] and self.would_lose(s, batch, below=True,
                                                                                     shapes=shapes):
                    self.probe_left[s] = 0  # a probe carried into a load where the shape cannot win: ended
                    continue
                if s != NONE and self.probe_left[s] == 0 and self.would_lose(s, batch, shapes=shapes, best_case=True):
                    continue  # a young acceptance mean is not refilled where even a whole depth a round would lose
                self.probe_left[s] = max(self.probe_left[s] - 1, 0)
                if s == NONE and self.probe_left[s] == 0 and self._probe_unread(s, batch):
                    self.probe_left[s] = 1
                return s
        best = self.best(batch, wave, shapes)
        if best != self.current:
            self._hold_reference(best)
        self.current = best
        self.probe_every[best] = PROBE_EVERY
        return best

    def _probe_unread(self, s: TreeShape, batch: int) -> bool:
        """Whether a probe of ``s`` ends with its cost still unread at ``batch``, before :data:`PROBE_STEPS_MAX` steps.
        A probe's steps are read only when no prompt came in between (:class:`PendingRecord`); under a stream of long
        prompts a request joins every two or three steps, and in run V2 two probes of no speculation at 16 requests read
        none of their steps: its cost there stayed what it was at 32, 11.2 ms for a ~7 ms step. Only no speculation's
        probe goes on so (its steps draft nothing)."""
        return not self.verify_cost[s].covers(batch) and self.steps - self.last_probe[s] < PROBE_STEPS_MAX

    def would_lose(self, s: TreeShape, batch: int, below: bool = False, shapes: Optional[list] = None,
                   best_case: bool = False) -> bool:
        """Whether a probe of ``s`` at ``batch`` could not change the choice, so is not worth paying for (a tree step
        at 16 to 32 requests costs 3 to 6 plain ones): ``s`` loses even at its lowest plausible cost there while each
        rival costs its estimate (``best_case``: and even accepting its whole depth every round, whatever its own
        acceptance mean says). False when it cannot tell.

        - ``s``'s lowest cost: the larger of its :meth:`Line.floor` (from a smaller batch, or a larger one scaled
          down by the load; ``below``: from half as many requests or fewer, so a periodic probe still refreshes a
          shape that loses by less than its cost grows from half the batch) and what a shape verifying fewer tokens
          costs at this batch, observed lately (more tokens never cost less).
        - A rival: another shape with a measured cost and an acceptance mean, however young (a mean started afresh
          is too young to choose its shape on, but the best estimate of what it would do) among ``shapes`` (default
          all), at its estimate, or,
          where its cost was not measured at this batch, at its :meth:`Line.ceiling` (its cost at a larger one); a
          rival verifying fewer tokens than ``s`` counts at its estimate even there (a probe of ``s`` costs more a
          step than the rival's steps).

        The bounds from a larger batch decide the first steps of a load that drained into a new bucket (a closed
        batch of 32 at 28 to 13 requests); ``benchmarks/HISTORY.md`` (stops 34 to 40) has the runs behind each."""
        floor = self.verify_cost[s].floor(batch, below)
        floor = None if floor is None else self.drift(s, batch) * floor
        smaller = [self.verify_seconds(o, batch) for o in self.shapes if o.total_tokens < s.total_tokens
                   and self.verify_cost[o].covers(batch) and self.steps - self.last_observed[o] <= STALE_STEPS]
        if smaller:  # a tree's own floor from batch 1 says little at 16: it verifies 16 times the tokens there
            floor = max([floor or 0.0] + smaller)
        rivals = []
        for o in (o for o in (self.shapes if shapes is None else shapes) if o != s and self._measured(o, min_rounds=1)):
            if self.verify_cost[o].covers(batch):
                rivals.append(self.tokens_per_second(o, batch))
            elif (ceiling := self.verify_cost[o].ceiling(batch)) is not None:
                rivals.append(self.tokens_per_second(o, batch, verify_seconds=self.drift(o, batch) * ceiling))
            elif o.total_tokens < s.total_tokens:  # measured near no load like this one lately: its estimate
                rivals.append(self.tokens_per_second(o, batch))
        accepted = float(s.depth) if best_case else self.expected_accepted(s)
        if floor is None or accepted is None or not rivals:
            return False
        return self.tokens_per_second(s, batch, verify_seconds=floor, accepted=accepted) < max(rivals)

    def _measured(self, s: TreeShape, min_rounds: int = MIN_ROUNDS) -> bool:
        """Whether ``s`` has enough measurements to be judged on: :data:`MIN_OBSERVATIONS` step costs, and (but for
        no speculation) ``min_rounds`` request-rounds of acceptance."""
        enough_rounds = s == NONE or self.accepted[s].rounds >= min_rounds
        return self.verify_cost[s].observations >= MIN_OBSERVATIONS and enough_rounds

    def best(self, batch: int, wave: Optional[Wave] = None, shapes: Optional[list] = None) -> TreeShape:
        """The shape of ``shapes`` (default all, largest first) expected to be fastest for ``batch`` requests (for a
        closed ``wave``, to end it soonest); a shape bigger than the one chosen last must be :data:`MARGIN` faster than
        the best smaller one, the one chosen last (and smaller ones) only faster: near the margin the budget keeps its
        shape rather than switch back and forth."""
        def merit(s: TreeShape) -> float:
            return self.tokens_per_second(s, batch) * (1.0 if wave is None else self._wave_factor(s, batch, wave))

        shapes = self.shapes if shapes is None else shapes
        best = NONE
        kept = shapes.index(self.current) if self.current in shapes else 0  # it and smaller ones need no margin
        for i in reversed(range(len(shapes) - 1)):  # chain, then tree: growing
            margin = 1.0 if i >= kept else MARGIN
            if merit(shapes[i]) > margin * merit(best):
                best = shapes[i]
        return best

    def estimates(self, s: TreeShape, batch: int, wave: Optional[Wave] = None) -> dict:
        """What the budget expects of ``s`` for ``batch`` requests (and a closed ``wave``), and how much it rests on
        (for :class:`BudgetLog`); no expectations before ``s`` is measured."""
        rounds = self.accepted[s].rounds if s in self.accepted else None
        out = {"observations": self.verify_cost[s].observations, "rounds": rounds}
        if self._measured(s):
            out.update(drift=round(self.drift(s, batch), 3), tokens_per_s=round(self.tokens_per_second(s, batch), 1),
                       verify_ms=round(1e3 * self.verify_seconds(s, batch), 3),
                       draft_ms=round(1e3 * self.draft_seconds(s, batch), 3),
                       accepted=round(self.expected_accepted(s), 3))
            if wave is not None:
                out.update(wave_tokens_per_s=round(self.wave_tokens_per_second(s, wave), 1))
        return out

    def tokens_per_second(self, s: TreeShape, batch: int, verify_seconds: Optional[float] = None,
                          accepted: Optional[float] = None) -> float:
        """Expected tokens per second of ``s`` for ``batch`` requests; ``verify_seconds``: the step's cost but drafting,
        instead of its fitted line, and with it ``accepted``: draft tokens a round, instead of the expected (bounds,
        :meth:`would_lose`)."""
        if verify_seconds is None:
            return self._memoized(("tokens_per_second", s, batch),
                                  lambda: self.tokens_per_second(s, batch, self.verify_seconds(s, batch)))
        seconds = verify_seconds + self.draft_seconds(s, batch)
        return batch * (1 + (self.expected_accepted(s) if accepted is None else accepted)) / max(seconds, 1e-9)

    def _wave_factor(self, s: TreeShape, batch: int, wave: Wave) -> float:
        """What share of a step's tokens per second ``s`` keeps until the closed ``wave`` ends: its
        :meth:`wave_tokens_per_second` over its :meth:`tokens_per_second`, computed every :data:`WAVE_EVERY` steps
        (~0.3 ms at 32 requests) and at a new closed batch's first step, and applied to each step's estimate in
        between."""
        step, number, factor = self._wave_factors.get(s, (None, None, 1.0))
        if step is None or number != wave.number or self.steps - step >= WAVE_EVERY:
            factor = self.wave_tokens_per_second(s, wave) / max(self.tokens_per_second(s, batch), 1e-9)
            self._wave_factors[s] = (self.steps, wave.number, factor)
        return factor

    def wave_tokens_per_second(self, s: TreeShape, wave: Wave) -> float:
        """Expected tokens per second of ``s`` kept until the closed ``wave``'s last request ends (:mod:`.wave`): each
        request accepts :meth:`expected_accepted` times its own ratio to the recent mean, and a step costs what one
        of as many requests as are left costs."""
        def compute() -> float:
            per_step = torch.ones(len(wave.requests))
            if s != NONE:
                mean = self.accepted[self.chain or self.shapes[0]].value
                ratios = self._memoized(("ratios",), lambda: self.request_accepted.ratios(wave.requests, mean or 0.0))
                per_step += (self.expected_accepted(s) * ratios).clamp(0.0, float(s.depth))
            seconds = wave_seconds(wave.remaining, per_step,
                                   lambda b: self.verify_seconds(s, b) + self.draft_seconds(s, b))
            return float(wave.remaining.sum()) / max(seconds, 1e-9)
        return self._memoized(("wave_tokens_per_second", s), compute)

    def expected_accepted(self, s: TreeShape) -> float:
        """Accepted draft tokens per request-round expected of ``s`` now: for the tree, the chain's recent mean
        plus the tree's gain over its chain in the tree's rounds, taken as a ratio or as a difference, whichever is
        less, and at most its depth (its own mean when there is no chain shape, or no paired rounds yet). Across
        prompts the gain is neither a fixed ratio nor a fixed difference (on a prompt the chain finds hard, the
        other branches add much in ratio, little in tokens), and the tree's rounds come from the few prompts it
        was probed on: the lower of the two does not credit the tree everywhere with what it gained there."""
        if s == NONE:
            return 0.0
        chain, paired = self.chain, self.chain_in_tree.value
        if s == chain or chain is None or not paired or self.accepted[chain].value is None:
            return self.accepted[s].value
        now, tree = self.accepted[chain].value, self.accepted[s].value
        return max(min(now * tree / paired, now + tree - paired, float(s.depth)), 0.0)

    def verify_seconds(self, s: TreeShape, batch: int) -> float:
        """The expected seconds of a step verifying ``s`` for ``batch`` requests, but drafting, at today's speed."""
        return self.drift(s, batch) * self.verify_cost[s](batch)

    def draft_seconds(self, s: TreeShape, batch: int) -> float:
        line = self.draft_costs.get(s)
        return 0.0 if line is None else self.drift(s, batch) * self.draft_scale[s] * line(batch)

    def drift(self, s: TreeShape, batch: int) -> float:
        """How much slower this machine runs a step of ``batch`` requests now than when ``s``'s cost was last observed,
        read off the :attr:`reference` shape (the one being run): its cost line now against the same line then. 1 for
        the reference, and where the two lines cover neither ``batch`` nor a batch just outside its power-of-two bucket
        (an extrapolation says nothing of speed); where they cover only the latter, it is read there. Read as 1 next
        to a bucket both covered, the drift made the chain's cost jump between 15 requests (1) and 16 (1.29), and the
        budget alternated it with no speculation as the batch moved between the two (run U2).

        The reference is the shape chosen last once its own cost has been observed since (:meth:`_hand_over`). A
        shape just chosen holds the costs of its last run, possibly in another spell: read as they stand, they would
        undo the drift that chose it, and the budget would switch back at once (run I: the chain and no speculation
        alternating step after step). Until its own steps are measured, it is read through the drift that chose it: the
        reference's line as it stood then (:attr:`reference_line`), which a probe of the reference in between does not
        move (run W at 32: no speculation, chosen at a wave's first step, was read 1.15x dearer after three steps of a
        probe of the chain, the reference, read 17.3 ms against its 15.8 of the last pass, and the chain was drafted
        through the wave).

        Every cost is kept as measured, and only the shape being run shows how this machine's speed drifts (by tens
        of percent within minutes). An earlier budget kept costs divided by one slowdown that the chosen shape's steps
        moved, while the same steps moved that shape's own line: only their product was measured, and under noise
        their split ratcheted (median 4.7x in 3,000 simulated steps), inflating every other shape's estimate."""
        return self._memoized(("drift", s, batch), lambda: self._drift(s, batch))

    def _drift(self, s: TreeShape, batch: int) -> float:
        reference = self.reference
        then = self.lines_when_seen[s].get(reference)
        now = self.verify_cost[reference] if self.reference_line is None else self.reference_line
        ratio = None if s == reference or then is None else _speed_ratio(now, then, batch)
        return 1.0 if ratio is None else ratio

    def _memoized(self, key: tuple, compute):
        """``compute()``, computed once per :meth:`shape` call (which reads each estimate several times); always
        computed afresh elsewhere."""
        if self._memo is None:
            return compute()
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def _hand_over(self, chosen: TreeShape, batch: int) -> dict:
        """Make ``chosen``, observed for the first time since it was chosen, the :attr:`reference`; returns each other
        shape's drift as read off the old reference, which :meth:`record` carries across (its snapshot of ``chosen``'s
        line scaled so that it reads the same drift now): no reading jumps at the hand-over."""
        carried = {s: self.drift(s, batch) for s in self.shapes if s != chosen}
        self.reference, self.reference_line = chosen, None
        return carried

    def _hold_reference(self, chosen: TreeShape) -> None:
        """``chosen`` replaces the shape chosen last: until its own steps hand it the reference, the drift is read off
        the reference's line as it stands now (:meth:`drift`); none to hold when ``chosen`` is the reference."""
        if chosen == self.reference:
            self.reference_line = None
        elif self.reference_line is None:
            self.reference_line = self.verify_cost[self.reference].copy()

    def record(self, verified: TreeShape, drafted: TreeShape, trees: Optional[DraftTree], verdict: Optional[Verdict],
               decode_only: bool, step_seconds: float, draft_seconds: float, batch: int,
               requests: Optional[list] = None, warming: bool = False) -> None:
        """After a step of ``batch`` requests: the shape its trees were drafted with last step (``verified``) and
        this step (``drafted``), the trees verified (``trees [R, N]`` and their ``verdict``, rows whose tree was
        verified whole only: one the scheduler cut near a length limit accepts less than its shape would; None when
        there is none) and their requests' ids (``requests``, for each request's own acceptance), whether the step
        ran no prompt chunk, its seconds and the drafting's part of them.

        A step that switched shape (it drafted another shape than it verified, or verified another than the step
        before) is not a cost observation: its costs are the switch's (module docstring). An observed cost is kept as
        measured, with the other shapes' lines as they stand then (:meth:`drift`); a shape whose line covered neither
        the batch nor a batch next to its bucket when another was last seen is read from its first steps there on
        (next to it, the drift is read where it was covered: :meth:`drift`). ``warming``: the step is one of the first
        after the engine idled (:attr:`~eagle3_plugin.wave.QuietBatch.warming`), and its cost is not read where it ran
        :data:`WARM_SLOW` times slower than expected (:meth:`_slowed`)."""
        self.last_run[verified] = self.steps
        steady = verified == drafted and self.last_verified in (None, verified)
        steady = steady and not (warming and decode_only and self._slowed(verified, batch, step_seconds))
        self.last_verified = verified
        if decode_only and batch > 0 and steady:
            line = self.verify_cost[verified]
            if self.steps - self.last_observed[verified] > STALE_STEPS:  # read at today's speed until replaced
                line.forget_near(batch, today=self.drift(verified, batch))
            carried = self._hand_over(verified, batch) if verified == self.current != self.reference else {}
            self.last_observed[verified] = self.steps
            line.observe(batch, max(step_seconds - draft_seconds, 0.0))
            self.lines_when_seen[verified] = {o: self.verify_cost[o].copy() for o in self.shapes if o != verified}
            for s, lines in self.lines_when_seen.items():  # shapes seen before this one covered the batch: from now
                if s in carried:
                    lines[verified] = line.scaled(1 / carried[s])
                elif s != verified and (verified not in lines
                                        or nearest_covered(batch, line, lines[verified]) is None):
                    lines[verified] = line.copy()
        measured = self.draft_costs.get(drafted)
        if measured is not None and batch > 0 and measured(batch) > 0 and steady:
            scale = self.draft_scale[drafted]
            observed = draft_seconds / measured(batch)
            self.draft_scale[drafted] = 0.9 * scale + 0.1 * min(observed, OUTLIER * scale)
        if trees is None or verdict is None or verdict.num_accepted.numel() == 0 or trees.size <= 1:
            return
        self.accepted[verified].observe(verdict.num_accepted, self.steps)
        chain_accepted = verdict.num_accepted
        if self.chain is not None and verified == self.chain:
            self.chain_depths.observe(verdict.num_accepted, torch.full_like(verdict.num_accepted, self.chain.depth))
        elif self.chain is not None:
            chain_accepted, held = _chain_accepted(trees, verdict.accepted)
            self.chain_depths.observe(chain_accepted, held)
            chain_accepted = self.chain_depths.completed(chain_accepted, held)
            self.accepted[self.chain].observe(chain_accepted, self.steps)
            self.chain_in_tree.observe(chain_accepted, self.steps)
        if requests is not None:
            self.request_accepted.observe(requests, chain_accepted)

    def _slowed(self, s: TreeShape, batch: int, step_seconds: float) -> bool:
        """Whether a step of ``s`` took :data:`WARM_SLOW` times what ``s`` is expected to take at ``batch``, where its
        line covers ``batch`` (elsewhere the expectation is too loose to tell). In the demo's run 22 the chain, the
        shape being run, read the first ~20 steps after another server's turn at 2.6x its cost; no speculation,
        probed just after, read at its usual cost, was chosen, and the chain, read at the slow spell's cost from
        then on, was not drafted for ~600 steps (0.90x no speculation, against 1.30x in run 21)."""
        if not self.verify_cost[s].covers(batch):  # (a covered bucket holds MIN_OBSERVATIONS steps)
            return False
        return step_seconds > WARM_SLOW * (self.verify_seconds(s, batch) + self.draft_seconds(s, batch))

    def finished(self, requests) -> None:
        """``requests`` ended (or were dropped): their own acceptance stands for requests to come (:mod:`.wave`)."""
        self.request_accepted.forget(requests)


class PendingRecord:
    """A step's :meth:`TreeBudget.record`, held until the next step starts: a step's length is measured from its start
    to the next one's, so the engine's own work between model runs (scheduling, output processing) counts. A fixed
    budget learns nothing: :attr:`wanted` is False and nothing is held."""

    def __init__(self, budget: TreeBudget):
        self.budget, self._entry = budget, None

    @property
    def wanted(self) -> bool:
        """Whether steps are recorded (an auto budget): engines skip building what :meth:`hold` takes otherwise."""
        return self.budget.auto

    def hold(self, began: float, **entry) -> None:
        """The step that began at ``began`` (perf_counter): :meth:`TreeBudget.record`'s arguments but its length."""
        if self.wanted:
            self._entry = dict(entry, began=began)

    def release(self, now: Optional[float]) -> None:
        """Record the held step, if any, at a new step's start ``now``; None: the length is unknown (a prompt came
        between, or the engine may have idled), only acceptance and draft time are recorded."""
        if self._entry is None:
            return
        entry, self._entry = self._entry, None
        began = entry.pop("began")
        decode_only = entry.pop("decode_only", True) and now is not None
        self.budget.record(**entry, decode_only=decode_only, step_seconds=0.0 if now is None else now - began)


def _speed_ratio(now: Line, then: Line, batch: int) -> Optional[float]:
    """How many times ``then``'s cost ``now`` reads at ``batch`` or, where the two do not both cover it, at the
    nearest batch next to its bucket that they do (:func:`~eagle3_plugin.budget_estimates.nearest_covered`), within
    :data:`MAX_DRIFT`; None where there is none."""
    at = nearest_covered(batch, now, then)
    if at is None or then(at) <= 0:
        return None
    return min(max(now(at) / then(at), 1 / MAX_DRIFT), MAX_DRIFT)


def _chain_accepted(trees: DraftTree, accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B]`` each: how many accepted nodes (``accepted [B, depth + 1]``, root first), from the root down, are each
    their parent's first child: what the chain the tree contains (the draft's argmax at each level, for greedy
    drafting) accepted; and how deep that chain goes in the tree."""
    n = trees.size
    nodes = torch.arange(n, device=trees.parents.device)
    is_child = trees.parents[:, None, :] == nodes[None, :, None]  # [B, parent, child]
    first_child = torch.where(is_child.any(2), is_child.float().argmax(2), -1)
    child = accepted[:, 1:]
    on_chain = (child >= 0) & (first_child.gather(1, accepted[:, :-1].clamp(min=0)) == child)
    node, held = torch.zeros_like(accepted[:, 0]), torch.zeros_like(accepted[:, 0])
    for _ in range(child.shape[1]):  # down the first children from the root
        node = torch.where(node >= 0, first_child.gather(1, node.clamp(min=0)[:, None])[:, 0], -1)
        held += node >= 0
    return on_chain.long().cumprod(1).sum(1), held
