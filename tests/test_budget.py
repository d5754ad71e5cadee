"""The auto tree budget's bookkeeping (``eagle3_plugin/budget.py``, its estimates in ``budget_estimates.py``), without
an engine: acceptance is a mean over request-rounds, a shape is probed until enough request-rounds back its mean, and
the choice follows the measured costs (the tree at batch 1, no speculation under a load where verification is dear)."""

import json

import pytest
import torch

from eagle3_plugin.budget import (MARGIN, MIN_ROUNDS, NONE, PROBE_EVERY, PROBE_EVERY_MAX, PROBE_STEPS, PROBE_STEPS_MAX,
                                  WARM_SLOW, PendingRecord, TreeBudget)
from eagle3_plugin.budget_estimates import MIN_OBSERVATIONS, OUTLIER, ROUND_MEMORY, STALE_STEPS, Line, RoundMean
from eagle3_plugin.budget_log import LOG_ENV, LOG_EVERY, drafted_shares, drafted_summary
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.errors import Eagle3Error
from eagle3_plugin.sampler import Verdict
from eagle3_plugin.speculator import TreeShape
from eagle3_plugin.tree import DraftTree
from eagle3_plugin.wave import Wave

CONFIG = Eagle3Config(draft="unused", depth=3, top_k=2, total_tokens=5, budget="auto")


def rounds(batch: int, accepted_path: list[int]):
    """``batch`` identical trees (root; children 1, 2 of the root; 3 under 1; 4 under 3) and a verdict that accepts
    ``accepted_path`` (node indices after the root) in every row."""
    parents = torch.tensor([[-1, 0, 0, 1, 3]]).expand(batch, -1)
    depths = torch.tensor([[0, 1, 1, 2, 3]]).expand(batch, -1)
    tree = DraftTree(torch.arange(5).expand(batch, -1), parents, depths)
    path = torch.full((batch, CONFIG.depth + 1), -1)
    path[:, 0] = 0
    if accepted_path:
        path[:, 1:1 + len(accepted_path)] = torch.tensor(accepted_path)
    n = torch.full((batch,), len(accepted_path))
    return tree, Verdict(path, n, torch.zeros(batch, dtype=torch.long))


def seed_acceptance(budget: TreeBudget, tree: float, chain: float) -> None:
    """:data:`MIN_ROUNDS` request-rounds, as of now, in which the tree accepted ``tree`` and the chain ``chain``."""
    budget.accepted[budget.shapes[0]].observe(torch.full((MIN_ROUNDS,), tree), budget.steps)
    budget.accepted[budget.shapes[1]].observe(torch.full((MIN_ROUNDS,), chain), budget.steps)


def test_every_request_round_weighs_alike():
    mean = RoundMean()
    mean.observe(torch.tensor([4]), step=1)  # a step of one request
    mean.observe(torch.tensor([0, 0, 0]), step=2)  # a step of three
    decay = ROUND_MEMORY ** 3
    assert mean.value == pytest.approx(decay * 4 / (decay + 3)) and mean.rounds == 4


def test_a_shape_is_probed_until_enough_request_rounds_back_its_acceptance():
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    chosen = []
    for _ in range(MIN_ROUNDS + 2 * MIN_OBSERVATIONS + 2):
        shape = budget.shape(1)
        chosen.append(shape)
        trees, verdict = rounds(1, [1, 3] if shape != NONE else [])
        budget.record(shape, shape, trees if shape != NONE else None, verdict if shape != NONE else None, True,
                      0.01, 0.001, 1)
    assert chosen[:MIN_ROUNDS] == [tree] * MIN_ROUNDS  # one request-round per step: many steps of the tree
    assert budget.accepted[tree].value == pytest.approx(2)
    assert budget.accepted[chain].value == pytest.approx(2)  # path 1 -> 3: first children both, learned from trees
    then = chosen[MIN_ROUNDS:]  # the chain's acceptance is known: only its and no speculation's costs are probed
    # (the first step after a switch carries the switch's costs: it is not one of a shape's cost observations)
    assert then == [chain] * (MIN_OBSERVATIONS + 1) + [NONE] * (MIN_OBSERVATIONS + 1)


def test_the_choice_follows_the_measured_costs():
    budget = TreeBudget(CONFIG, {s: Line(0.001, 0.0001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    budget.verify_cost = {tree: fitted(0.010, 0.004), chain: fitted(0.010, 0.0015), NONE: fitted(0.010, 0.0002)}
    seed_acceptance(budget, tree=3, chain=2)
    budget.last_run = {s: 0 for s in budget.shapes}
    assert budget.shape(1) == tree  # 4 tokens for ~15 ms against 1 for ~11 ms
    assert budget.shape(32) == NONE  # the tree's verification grows 20x faster with the batch than no speculation
    assert budget.shape(4) == chain
    assert budget.tokens_per_second(NONE, 32) == pytest.approx(32 / (0.010 + 0.0002 * 32 + 0.001 + 0.0001 * 32))


def fitted(fixed: float, per_unit: float, batches=(1, 4, 16, 32)) -> Line:
    """A cost line observed exactly on ``seconds = fixed + per_unit * batch`` at ``batches``."""
    line = Line()
    for _ in range(MIN_OBSERVATIONS):
        for b in batches:
            line.observe(b, fixed + per_unit * b)
    return line


def test_a_cost_line_is_trusted_only_near_the_batch_sizes_it_was_measured_at():
    line = fitted(0.010, 0.001, batches=(1, 4))
    assert line(32) == pytest.approx(0.042)  # what the fit extrapolates
    assert line.covers(1) and line.covers(4) and line.covers(7)  # within a factor of 2 (a power-of-two bucket)
    assert not line.covers(2) and not line.covers(8) and not line.covers(32)
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    budget.verify_cost = {tree: fitted(0.010, 0.004), chain: fitted(0.010, 0.0015),
                          NONE: fitted(0.010, 0.001, batches=(1, 4))}
    seed_acceptance(budget, tree=3, chain=2)
    assert budget.shape(4) == chain  # measured there: chosen by its cost
    chosen = [budget.shape(32) for _ in range(PROBE_STEPS)]
    assert chosen == [NONE] * PROBE_STEPS  # not measured near 32: probed there first
    for _ in range(PROBE_STEPS):  # where a step costs 12 ms, not the 42 extrapolated
        budget.record(NONE, NONE, None, None, True, 0.012, 0.0, 32)
    assert budget.verify_cost[NONE].covers(32) and budget.verify_cost[NONE](32) < 0.020
    assert budget.shape(32) == NONE  # 32 tokens in ~13 ms against the chain's 96 in ~59


def test_a_cost_line_reads_what_was_measured_near_a_batch_rather_than_its_fit_over_all_batches():
    """A step's cost is not a line in the batch size: here 7 ms at 1 request and ~13 ms from 5 to 32. A line fitted
    over all of them reads ~10 ms at 1 (run R's budget read 14.6 ms for a 6.9 ms step and drafted the tree for
    ~850 steps); near a batch it was measured at, it reads the observations there."""
    line = Line()
    for _ in range(3):
        for batch, seconds in ((5, 0.0125), (8, 0.0128), (16, 0.0136), (32, 0.0152)):
            line.observe(batch, seconds)
    for _ in range(MIN_OBSERVATIONS):
        line.observe(1, 0.007)
    assert line.covers(1) and line.fixed + line.per_unit > 0.009  # the fit over all batches
    assert line(1) == pytest.approx(0.007, rel=0.02)
    assert line(16) == pytest.approx(0.0136, rel=0.05)
    assert not Line(0.002, 0.001).covers(4) and Line(0.002, 0.001)(4) == pytest.approx(0.006)  # nothing observed


def test_a_bucket_is_read_only_once_enough_steps_back_it():
    """Run U3 at ~16 requests: no speculation's observations at 16 were dropped as stale, and the first step there
    afterwards, a slow one (15 ms against ~10), was all the bucket held. Read as the bucket's mean, it put no
    speculation at 15 ms from 16 requests up while it read ~10 at 15, and the budget alternated the chain (at 16) and
    nothing (at 15) for the rest of the pass. A bucket is read once :data:`MIN_OBSERVATIONS` steps back it; until
    then the line reads there as where nothing was measured, and the budget probes the shape there."""
    line = Line()
    for _ in range(20):
        line.observe(15, 0.010)
    line.forget_near(16)
    line.observe(16, 0.015)
    assert not line.covers(16) and line(16) == pytest.approx(0.010, rel=0.1)
    for _ in range(MIN_OBSERVATIONS - 1):
        line.observe(16, 0.015)
    assert line.covers(16) and line(16) == pytest.approx(0.015, rel=0.02)  # three steps say it: read there
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    seed_acceptance(budget, tree=0.7, chain=0.6)
    run_in_turn(budget, {tree: 0.060, chain: 0.020, NONE: 0.010}, batch=15)
    budget.verify_cost[NONE].observe(16, 0.015)
    assert budget.verify_seconds(NONE, 16) < 0.012  # 1 token in ~11 ms against the chain's 1.6 in ~21
    assert budget.shape(16) == NONE


def test_a_stale_bucket_is_read_at_todays_speed_until_enough_fresh_steps_replace_it():
    """Run V at 32 requests: no speculation, back after a pass at 16, was chosen at 32 on its bucket there read at
    today's speed (7.8 ms); its next step dropped that bucket as stale, the bucket below was read instead (11.4 ms),
    and the chain was drafted through the rest of the pass. Stale observations are now read at today's speed until
    MIN_OBSERVATIONS fresh ones replace them."""
    line = Line()
    for batch, seconds in [(32, 0.00825)] * 5 + [(19, 0.006)] * 5:
        line.observe(batch, seconds)
    line.forget_near(32, today=0.94)
    line.observe(32, 0.011)
    assert line.covers(32) and line(32) == pytest.approx(0.94 * 0.00825)
    for _ in range(MIN_OBSERVATIONS - 1):
        line.observe(32, 0.011)
    assert line(32) == pytest.approx(0.011)  # the fresh steps alone


def test_a_cost_line_does_not_jump_where_the_batch_crosses_into_the_next_bucket():
    """Run S2 at ~16 requests: the chain's cost read 13.1 ms at 15 requests (bucket 8-15, observed mostly nearer 10)
    and 17.6 ms at 16 (bucket 16-31), and the budget alternated the chain and no speculation step after step as
    admissions and finishes moved the batch between 15 and 16. Between two covered buckets' centroids the line is
    read on the straight line through them: one request more costs what the observations on either side say it does,
    not the jump between two buckets' readings through a slope fitted over all batches."""
    line = Line()
    for _ in range(3):
        for batch, seconds in ((1, 0.003), (10, 0.012), (16, 0.0176), (32, 0.022)):
            line.observe(batch, seconds)
    assert line.per_unit < 0.0007  # the fit over all batches: flatter than the 0.93 ms a request between 10 and 16
    readings = [line(b) for b in range(10, 17)]
    assert readings[0] == pytest.approx(0.012) and readings[-1] == pytest.approx(0.0176)
    steps = [b - a for a, b in zip(readings, readings[1:])]
    assert all(step == pytest.approx((0.0176 - 0.012) / 6) for step in steps)
    assert line(1) == pytest.approx(0.003) and line(32) == pytest.approx(0.022)  # each centroid reads as measured
    assert line(40) == pytest.approx(0.022 + 8 * line.per_unit)  # past the last centroid: its bucket and the slope


def test_a_shape_measured_only_at_neighbouring_batches_is_probed_before_it_is_believed():
    """Run T: the chain's steps at 2 and 3 requests, as the engine's start-up pass drained, read 9.7 ms (first steps
    are slow); at one request its step is 3.4 ms, and the tree, measured there, was drafted for ~600 steps. Those
    observations do not cover one request: the chain is probed there, then read from its own steps."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    budget.verify_cost = {tree: fitted(0.006, 0.0, batches=(1,)), chain: fitted(0.0097, 0.0, batches=(2, 3)),
                          NONE: fitted(0.002, 0.0, batches=(1,))}
    seed_acceptance(budget, tree=2.6, chain=2.2)
    assert not budget.verify_cost[chain].covers(1)
    assert budget.tokens_per_second(tree, 1) > MARGIN * budget.tokens_per_second(chain, 1)  # what it reads there
    chosen = []
    for _ in range(PROBE_STEPS + 1):
        shape = budget.shape(1)
        chosen.append(shape)
        budget.record(shape, shape, None, None, True, {tree: 0.007, chain: 0.0044, NONE: 0.003}[shape], 0.001, 1)
    assert chosen == [chain] * PROBE_STEPS + [chain]  # probed at once, then chosen on its own steps there
    assert budget.verify_cost[chain](1) == pytest.approx(0.0034)


def test_the_steps_that_switch_shape_are_not_read_as_either_shapes_cost():
    """As an engine records: each step verifies what the step before drafted. Run Y at 16 requests: the first step
    without drafts after the chain's took 4.4 ms, the step back to the chain 3.6 ms, the steps between 2.4 ms."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    chain = budget.shapes[1]
    drafted = [chain] * 10 + [NONE] * PROBE_STEPS + [chain] * 10
    verified = [chain] + drafted[:-1]
    for v, d in zip(verified, drafted):
        seconds = {(chain, chain): 0.0052, (chain, NONE): 0.0052, (NONE, NONE): 0.0024, (NONE, chain): 0.0036}[v, d]
        if v == NONE and budget.last_verified == chain:
            seconds = 0.0044
        drafting = 0.002 if d == chain else 0.0
        budget.record(v, d, None, None, True, seconds + drafting, drafting, 16)
    assert budget.verify_cost[NONE].observations == PROBE_STEPS - 2
    assert budget.verify_cost[NONE](16) == pytest.approx(0.0024)
    assert budget.verify_cost[chain](16) == pytest.approx(0.0052)


def test_no_speculation_is_probed_at_a_steady_pace_and_read_from_its_probe_alone():
    """Run W: no speculation's cost at one request came from a few steps in a slow spell (8 ms kept), and its probes,
    ever rarer and mixed with that, left it at twice its cost: the chain was drafted where it lost. A probe of no
    speculation costs only a few steps' drafts: it comes every PROBE_EVERY steps, and reads its own steps there."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    budget.verify_cost = {tree: fitted(0.012, 0.0), chain: fitted(0.005, 0.0), NONE: fitted(0.008, 0.0)}
    seed_acceptance(budget, tree=2.2, chain=2.0)
    probes = []
    for step in range(1, 5 * PROBE_EVERY):
        shape = budget.shape(1)
        if shape == NONE:
            probes.append(step)
        budget.record(shape, shape, None, None, True, {tree: 0.013, chain: 0.006, NONE: 0.0025}[shape], 0.001, 1)
        if step % 50 == 0:  # prompts come and go: the acceptance means stay fed
            seed_acceptance(budget, tree=2.2, chain=2.0)
    starts = [s for i, s in enumerate(probes) if i == 0 or probes[i - 1] != s - 1]
    assert {b - a for a, b in zip(starts, starts[1:])} == {PROBE_EVERY + PROBE_STEPS}
    assert budget.verify_cost[NONE](1) == pytest.approx(0.0015)
    assert budget.shape(1) == chain  # 3 tokens in 6 ms against 1 in 2.5 ms: the chain still pays


def test_a_probe_of_no_speculation_goes_on_until_its_steps_are_read():
    """Run V2, a stream of long prompts at 16 requests: a request joined every two or three steps, a step is read
    only when no prompt came in between, and two probes of no speculation read none of their steps; its cost at 16
    stayed what it was at 32 (11.2 ms for a ~7 ms step), and the chain was drafted where it lost. The probe now goes
    on until its cost is read there, for at most PROBE_STEPS_MAX steps."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    seed_acceptance(budget, tree=0.7, chain=0.6)
    run_in_turn(budget, {tree: 0.060, NONE: 0.011}, batch=32)
    run_in_turn(budget, {chain: 0.012}, batch=16)
    budget.last_verified = chain
    drafted, previous = [], chain
    for step in range(PROBE_STEPS_MAX + 10):
        shape = budget.shape(16)
        drafted.append(shape)
        joined = step < 2 * PROBE_STEPS  # a prompt in each of the probe's first ten steps
        budget.record(previous, shape, None, None, not joined, 0.007 if previous == NONE else 0.013, 0.0, 16)
        previous = shape
    assert budget.verify_cost[NONE].covers(16) and budget.verify_cost[NONE](16) == pytest.approx(0.007)
    # Probed past its ten unread steps, then chosen: 16 tokens in 7 ms against the chain's 25.6 in 13 (a five-step
    # probe read nothing, and the chain was drafted on, no speculation read at 11 ms).
    assert drafted == [NONE] * len(drafted)


def test_an_acceptance_mean_left_unfed_starts_afresh_and_its_shape_is_probed_until_fresh_rounds_back_it():
    """Run R: the chain's acceptance mean came from the hard prompts that drained the last batch, nothing was
    drafted after that, and 3-step probes moved the mean by 3% each: none was drafted for ~4,000 steps while the
    chain was faster. Here the chain accepts nothing for 300 steps (no speculation takes over), then prompts it
    accepts 2 tokens a round on: its next probe finds its mean stale, runs until MIN_ROUNDS fresh rounds back it,
    and the chain is drafted from then on, judged on those rounds alone."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    budget.verify_cost = {tree: fitted(0.030, 0.0), chain: fitted(0.010, 0.0), NONE: fitted(0.008, 0.0)}
    seed_acceptance(budget, tree=2, chain=2)
    hard, chosen = 300, []
    for step in range(hard + 3 * PROBE_EVERY):
        shape = budget.shape(1)
        chosen.append(shape)
        trees, verdict = rounds(1, [] if step < hard else [1, 3])
        budget.record(shape, shape, trees if shape != NONE else None, verdict if shape != NONE else None, True,
                      {tree: 0.031, chain: 0.011, NONE: 0.009}[shape], 0.001, 1)
    assert chosen[hard - STALE_STEPS:hard] == [NONE] * STALE_STEPS  # the chain lost on the hard prompts
    probe = chosen.index(chain, hard)
    assert probe <= hard + PROBE_EVERY
    assert chosen[probe:probe + MIN_ROUNDS] == [chain] * MIN_ROUNDS
    after = chosen[probe + MIN_ROUNDS:]
    assert after.count(chain) > 0.9 * len(after)  # but for the probes of the others
    assert budget.accepted[chain].value == pytest.approx(2)


def test_a_held_step_is_recorded_from_its_start_to_the_next_one():
    budget = TreeBudget(CONFIG)
    pending = PendingRecord(budget)
    tree = budget.shapes[0]
    trees, verdict = rounds(2, [1, 3])
    pending.hold(10.0, verified=tree, drafted=tree, trees=trees, verdict=verdict, decode_only=True,
                 draft_seconds=0.002, batch=2)
    assert budget.verify_cost[tree].observations == 0  # its length is not known yet
    pending.release(10.05)
    assert budget.verify_cost[tree](2) == pytest.approx(0.048)  # next start - start - drafting
    assert budget.accepted[tree].rounds == 2
    pending.hold(11.0, verified=tree, drafted=tree, trees=trees, verdict=verdict, decode_only=True,
                 draft_seconds=0.002, batch=2)
    pending.release(None)  # a prompt came between: its length says nothing of a decode step's cost
    assert budget.verify_cost[tree].observations == 1 and budget.accepted[tree].rounds == 4
    pending.release(12.0)  # nothing held: nothing recorded twice
    assert budget.verify_cost[tree].observations == 1


def test_a_slowed_step_moves_a_fitted_cost_by_little_and_a_lasting_change_is_followed():
    line = Line()
    for _ in range(20):
        line.observe(1, 0.010)
    line.observe(1, 0.500)  # another process had the CPU (or the engine idled) during one step
    assert line(1) < 0.011  # counted as OUTLIER x the fit: +5% at most, where the mean would have tripled
    for _ in range(80):
        line.observe(1, 0.040)  # the step really got 4x dearer
    assert line(1) == pytest.approx(0.040, rel=0.05)
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree = budget.shapes[0]
    budget.record(tree, tree, None, None, False, 0.0, 0.100, 1)  # drafting slowed 100x, once
    assert budget.draft_scale[tree] == pytest.approx(0.9 + 0.1 * OUTLIER)


def test_a_shape_not_run_is_probed_for_a_few_steps_in_a_row():
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    for s in budget.shapes:
        for _ in range(20):
            budget.verify_cost[s].observe(1, 0.010 if s == tree else 0.030)  # the others looked dear once
    seed_acceptance(budget, tree=3, chain=3)
    chosen = []
    for _ in range(PROBE_EVERY + 2 * PROBE_STEPS + 1):
        shape = budget.shape(1)
        chosen.append(shape)
        budget.record(shape, shape, None, None, True, 0.011 if shape == tree else 0.021, 0.001, 1)
    assert chosen[-2 * PROBE_STEPS - 2:] == [tree] + [chain] * PROBE_STEPS + [NONE] * PROBE_STEPS + [tree]
    # what was observed long ago is stale: the probes' own steps are read (20 ms, not a mix with the old 30)
    assert budget.verify_cost[chain](1) == pytest.approx(0.020) and budget.verify_cost[NONE](1) == pytest.approx(0.020)


def test_the_tree_is_judged_on_the_same_rounds_as_its_chain():
    """The tree ran on easy prompts (accepting 2 a round, its chain 1.5 on those rounds), the chain then on hard
    ones (nothing accepted): the tree is expected to do 4/3 of the chain now, not its own old mean."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    budget.verify_cost = {tree: fitted(0.011, 0.0), chain: fitted(0.010, 0.0), NONE: fitted(0.008, 0.0)}
    for path in ([1, 3, 4], [2]) * MIN_ROUNDS:  # the tree's own rounds: 3 and 1 accepted, its chain's 3 and 0
        budget.record(tree, tree, *rounds(1, path), True, 0.012, 0.001, 1)
    assert budget.accepted[tree].value == pytest.approx(2, rel=0.05)
    assert budget.expected_accepted(tree) == pytest.approx(2, rel=0.05)  # the chain's mean is the tree's rounds'
    assert budget.shape(1) == tree
    for _ in range(300):  # the chain on a hard prompt
        budget.record(chain, chain, *rounds(1, []), True, 0.011, 0.001, 1)
    ratio = budget.accepted[tree].value / budget.chain_in_tree.value
    assert ratio == pytest.approx(4 / 3, rel=0.05)
    assert budget.expected_accepted(tree) == pytest.approx(budget.accepted[chain].value * ratio)
    assert budget.expected_accepted(tree) < 0.2 and budget.shape(1) == NONE


def test_speculation_must_be_expected_to_pay_by_the_margin():
    """The chain accepts 2 a round; a step costs 10 ms without speculation. At a chain step of 25 ms it is expected
    to be 1.2x faster and is chosen; at 28 ms, 1.07x: not enough to pay for what a step's estimate does not see."""
    for chain_ms, chosen in ((25, "chain"), (28, "none")):
        budget = TreeBudget(CONFIG, {s: Line(0.0) for s in TreeBudget(CONFIG).shapes})
        tree, chain = budget.shapes[:2]
        budget.verify_cost = {tree: fitted(0.100, 0.0), chain: fitted(chain_ms / 1e3, 0.0), NONE: fitted(0.010, 0.0)}
        seed_acceptance(budget, tree=2, chain=2)
        ratio = budget.tokens_per_second(chain, 1) / budget.tokens_per_second(NONE, 1)
        assert (ratio > MARGIN) == (chosen == "chain")
        assert budget.shape(1) == {"chain": chain, "none": NONE}[chosen]


def test_steps_that_verify_chains_only_choose_among_chains():
    """Where every request verifies a chain only (vLLM's grammars), a tree would be its leading path at a tree's
    cost: the tree is left out, even where it is the best shape; the chain is chosen against no speculation on its
    own merit, and a fixed budget drafts the tree's chain. A seeded request keeps the configured tree."""
    fixed = TreeBudget(Eagle3Config(draft="unused", depth=3, top_k=2, total_tokens=5, budget="fixed"))
    tree, chain = fixed.shapes[:2]
    assert fixed.shape(1, chains_only=True) == chain and fixed.shape(1) == tree
    assert fixed.shape(1, seeded=True, chains_only=True) == tree
    for chain_ms, expected in ((15, chain), (40, NONE)):
        budget = TreeBudget(CONFIG, {s: Line(0.0) for s in TreeBudget(CONFIG).shapes})
        budget.verify_cost = {tree: fitted(0.012, 0.0), chain: fitted(chain_ms / 1e3, 0.0), NONE: fitted(0.010, 0.0)}
        seed_acceptance(budget, tree=3, chain=2)
        budget.last_run = {s: budget.steps for s in budget.shapes}
        assert budget.shape(1) == tree
        assert [budget.shape(1, chains_only=True) for _ in range(3)] == [expected] * 3
        assert budget.shape(1, seeded=True, chains_only=True) == tree


def test_a_chosen_shape_is_kept_until_it_is_expected_to_lose():
    """Hysteresis: the chain (2 accepted a round) is chosen at 25 ms a step against no speculation's 10 (1.2x), kept
    when it costs 28 (1.07x, under the margin), dropped at 33 (0.91x), and not taken back at 28."""
    budget = TreeBudget(CONFIG, {s: Line(0.0) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    seed_acceptance(budget, tree=2, chain=2)
    chosen = []
    for chain_ms in (25, 28, 33, 28):
        budget.verify_cost = {tree: fitted(0.100, 0.0), chain: fitted(chain_ms / 1e3, 0.0), NONE: fitted(0.010, 0.0)}
        chosen.append(budget.shape(1))
    assert chosen == [chain, chain, NONE, NONE]


def test_a_shape_that_keeps_losing_is_probed_ever_less_often():
    """The tree costs 10x no speculation's step at one request and is never chosen: its probes come after 200, 400,
    800 ... steps without it (capped), where a fixed interval would pay for it every 200 steps."""
    budget = TreeBudget(CONFIG, {s: Line(0.0) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    budget.verify_cost = {tree: fitted(0.100, 0.0), chain: fitted(0.030, 0.0), NONE: fitted(0.010, 0.0)}
    seed_acceptance(budget, tree=2, chain=2)
    probes = []
    for step in range(1, 8000):
        shape = budget.shape(1)
        if shape == tree:
            probes.append(step)
        budget.record(shape, shape, None, None, True, {tree: 0.100, chain: 0.030, NONE: 0.010}[shape], 0.0, 1)
    starts = [s for i, s in enumerate(probes) if i == 0 or probes[i - 1] != s - 1]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert probes == [s + i for s in starts for i in range(PROBE_STEPS)]  # each probe: PROBE_STEPS steps in a row
    assert gaps[:4] == [2 * PROBE_EVERY + PROBE_STEPS, 4 * PROBE_EVERY + PROBE_STEPS, 8 * PROBE_EVERY + PROBE_STEPS,
                        PROBE_EVERY_MAX + PROBE_STEPS]
    assert budget.shape(1) == NONE


def test_a_periodic_probe_is_skipped_where_the_shape_would_lose_even_at_half_the_load():
    """At 16 requests the tree would lose even at its cost for 8 (a tree probe there cost ~6 plain steps a step in
    stop 37's run C and ~3 chain steps in stop 38's): its periodic probes skip it there, and it is probed when the
    load falls to where it might win; no speculation is still probed at its steady pace."""
    budget = TreeBudget(CONFIG, {s: Line(0.0) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    costs = {tree: (0.020, 0.004), chain: (0.008, 0.0005), NONE: (0.007, 0.0002)}  # fixed, per request
    budget.verify_cost = {s: fitted(*c) for s, c in costs.items()}
    seed_acceptance(budget, tree=3, chain=2)
    drafted = []
    for step in range(1, 3 * PROBE_EVERY):
        batch = 16 if step < 2 * PROBE_EVERY else 1
        if step == 2 * PROBE_EVERY:  # the tree is overdue for a probe, and loses at 16 even at its cost for 8
            assert budget.steps - budget.last_run[tree] > budget.probe_every[tree]
            assert budget.would_lose(tree, 16, below=True) and not budget.would_lose(tree, 1, below=True)
        shape = budget.shape(batch)
        drafted.append((batch, shape))
        budget.record(shape, shape, None, None, True, costs[shape][0] + costs[shape][1] * batch, 0.0, batch)
    assert (16, tree) not in drafted and (1, tree) in drafted
    assert drafted.count((16, NONE)) >= PROBE_STEPS


def test_a_shape_that_loses_at_a_smaller_batch_is_not_probed_at_a_larger_one():
    """More requests never make a step cheaper: a tree that would lose at 32 requests even at its cost measured at 8
    is not probed at 32 (each probe step there costs several plain ones); the chain, which could win there, is."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    budget.verify_cost = {tree: fitted(0.030, 0.006, batches=(4, 8)), chain: fitted(0.010, 0.0005, batches=(4, 8)),
                          NONE: fitted(0.010, 0.0002)}
    seed_acceptance(budget, tree=3, chain=2)
    budget.steps = PROBE_EVERY  # every shape run lately (no periodic probe due), the last probes long ago
    budget.last_run = {s: budget.steps for s in budget.shapes}
    assert not budget.verify_cost[tree].covers(32)  # measured at 4 and 8 only
    assert budget.verify_cost[tree].floor(32) == pytest.approx(budget.verify_cost[tree](8))
    assert budget.would_lose(tree, 32)  # 4 tokens a request in >= 79 ms against none's 32 in ~17 ms
    assert not budget.would_lose(chain, 32)  # 3 a request in >= 15 ms: it might win at 32
    assert [budget.shape(32) for _ in range(PROBE_STEPS)] == [chain] * PROBE_STEPS
    assert budget.would_lose(tree, 2)  # nothing measured at or below 2, but half its cost at 4 already loses
    assert Line().floor(32) is None and Line().ceiling(32) is None


def test_a_cost_is_bounded_from_a_larger_batch_by_the_load():
    """Measured at 32 requests only: at 24 a step costs at most what it cost at 32 (more requests never cost less) and
    at least that times 24/32 (batching never makes a request dearer)."""
    line = fitted(0.002, 0.001, batches=(32,))
    assert not line.covers(24) and line.covers(32)
    assert line.ceiling(24) == pytest.approx(0.034) and line.floor(24) == pytest.approx(0.034 * 24 / 32)
    assert line.floor(24, below=True) is None  # a periodic probe's bound reads smaller batches only
    assert line.ceiling(48) == pytest.approx(line(48)) and line.ceiling(64) is None  # 32-63: one bucket


def test_a_batch_drained_into_a_new_bucket_does_not_probe_a_shape_that_loses_even_at_its_cost_scaled_down():
    """Every shape measured at 32 requests alone (a closed batch: the tree 38 ms a step, the chain 11, no speculation
    5), the chain chosen there. As the batch drains to 24, no shape's cost covers that load. The tree, first in line,
    used to be probed there (a closed batch of 32 in vLLM: 5 tree steps at 28 to 13 requests, ~50 ms each against ~10
    ms): even at 24/32 of its cost at 32 it loses to the chain at the chain's full cost at 32. The chain, which may
    well cost less at 24, is probed."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    seed_acceptance(budget, tree=3, chain=2.8)
    run_in_turn(budget, {tree: 0.038, NONE: 0.005, chain: 0.011}, batch=32)
    assert budget.shape(32) == chain
    assert budget.would_lose(tree, 24) and not budget.would_lose(chain, 24)
    assert [budget.shape(24) for _ in range(PROBE_STEPS)] == [chain] * PROBE_STEPS


def tree_measured_at_one_request(current_is_chain: bool = True) -> tuple[TreeBudget, TreeShape, TreeShape]:
    """A budget at step :data:`PROBE_EVERY` with every shape run lately: the tree's cost measured at one request alone
    (9 ms a step), the chain's (4 ms + 0.5 a request) and no speculation's (3 + 0.3) at 1 to 32; drafting 8, 2 and 0
    ms at any batch; acceptance seeded (tree 3, chain 2); the chain chosen, or no speculation. Returns it, the tree
    and the chain."""
    tree, chain = TreeBudget(CONFIG).shapes[:2]
    budget = TreeBudget(CONFIG, {tree: Line(0.008), chain: Line(0.002), NONE: Line(0.0)})
    budget.verify_cost = {tree: fitted(0.009, 0.0, batches=(1,)), chain: fitted(0.004, 0.0005),
                          NONE: fitted(0.003, 0.0003)}
    seed_acceptance(budget, tree=3, chain=2)
    budget.current = chain if current_is_chain else NONE
    budget.steps = PROBE_EVERY
    budget.last_run = {s: budget.steps for s in budget.shapes}
    return budget, tree, chain


def test_a_shape_costs_at_least_what_a_shape_verifying_fewer_tokens_costs_at_the_same_batch():
    """The tree was last measured at one request (9 ms a step) and its line says nothing of 16; the chain runs at 16
    (12 ms). The tree verifies 5 tokens a request against the chain's 4, so it costs at least 12 ms there, and with its
    draft it cannot win: not probed (stop 38's run F: a tree probe at 15-16 in every round, each step ~3 chain steps).
    A cost not observed lately is no such bound: it may be stale."""
    budget, tree, chain = tree_measured_at_one_request()
    budget.last_run[tree] = 0  # the tree's last probe long ago
    assert budget.verify_cost[tree].floor(16) == pytest.approx(0.009)  # alone, its floor would let it win
    assert budget.tokens_per_second(tree, 16, verify_seconds=0.009) > budget.tokens_per_second(chain, 16)
    assert not budget.would_lose(tree, 16)  # the chain's cost was not observed lately
    budget.last_observed = {s: budget.steps for s in budget.shapes}
    assert budget.would_lose(tree, 16)
    assert tree not in [budget.shape(16) for _ in range(PROBE_STEPS)]


def test_a_rival_whose_acceptance_mean_started_afresh_still_rules_a_probe_out():
    """As above, the tree cannot win at 16 against the chain; but the chain was not drafted for a while (no
    speculation chosen) and its acceptance mean started afresh, 8 rounds old: too young to choose the chain on (it is
    probed), still the best estimate of what it does. Judged against no speculation alone, the tree would win on paper
    and be probed (stop 40's run M: 5 tree steps at 14 requests, 5 at 16)."""
    budget, tree, chain = tree_measured_at_one_request(current_is_chain=False)
    budget.last_run[tree] = 0
    budget.last_observed = {s: budget.steps for s in budget.shapes}
    budget.accepted[chain] = RoundMean()
    budget.accepted[chain].observe(torch.full((8,), 2.0), budget.steps)
    assert budget.accepted[chain].rounds < MIN_ROUNDS
    assert budget.tokens_per_second(tree, 16, verify_seconds=budget.verify_seconds(chain, 16)) > \
        budget.tokens_per_second(NONE, 16)  # against no speculation alone the tree would be probed
    assert budget.would_lose(tree, 16)
    assert [budget.shape(16) for _ in range(PROBE_STEPS)] == [chain] * PROBE_STEPS  # the chain's mean is refreshed


def test_after_a_long_spell_at_one_request_the_tree_is_not_probed_where_smaller_shapes_are_expected_to_win():
    """Every shape measured at 1 to 32 requests, then 60 steps at one request: no line covers 32 any more (their
    observations there have faded), and the tree's floor is what it costs at one request. Against no rival it would be
    probed first in line at the first steps of 32 (stop 40's run N, at 16 and at 32 after cells at one request); the
    chain and no speculation, verifying fewer tokens, are expected to beat it even at that floor, so it is not."""
    tree, chain = TreeBudget(CONFIG).shapes[:2]
    budget = TreeBudget(CONFIG, {tree: Line(0.003, 0.0008), chain: Line(0.002, 0.00027), NONE: Line(0.0)})
    budget.verify_cost = {tree: fitted(0.009, 0.0019), chain: fitted(0.004, 0.0004), NONE: fitted(0.003, 0.00012)}
    for line in budget.verify_cost.values():
        for _ in range(60):
            line.observe(1, line(1))
    assert not any(line.covers(32) for line in budget.verify_cost.values())
    seed_acceptance(budget, tree=2.5, chain=1.9)
    budget.current = chain
    budget.steps = 1000
    budget.last_run = {s: budget.steps for s in budget.shapes}
    budget.last_observed = {s: budget.steps for s in budget.shapes}
    floor = budget.verify_cost[tree].floor(32)
    assert budget.tokens_per_second(tree, 32, verify_seconds=floor) < budget.tokens_per_second(NONE, 32)
    assert budget.would_lose(tree, 32) and not budget.would_lose(chain, 32)
    assert tree not in [budget.shape(32) for _ in range(3 * PROBE_STEPS)]


def test_a_probe_begun_at_a_small_batch_is_not_carried_into_a_load_where_the_shape_cannot_win():
    """Stop 38's run G: a probe of the tree began at one request, where it may win, and its acceptance mean had
    started afresh; the batch of one ended and 16 requests came before the mean held MIN_ROUNDS rounds, so the tree
    was drafted at 16 (5 steps at ~3 chain steps each). A probe carried to more than twice the load it began at ends
    there when the shape would lose even at half that load; at its own load, where it may win, it goes on."""
    budget, tree, chain = tree_measured_at_one_request()
    budget.verify_cost[tree] = fitted(0.004, 0.0, batches=(1,))
    budget.draft_costs[tree] = Line(0.001, 0.002)  # at one request 7 ms a step: it may win with 3 tokens a round
    budget.last_observed = {s: budget.steps for s in budget.shapes}
    budget.accepted[tree] = RoundMean()
    budget.accepted[tree].observe(torch.full((4,), 3.0), budget.steps)  # a fresh mean, 4 rounds: not measured
    budget.probe_batch[tree] = 1
    assert budget.shape(1) == tree  # at the load it began at, the probe goes on
    assert budget.shape(16) != tree and budget.shape(16) == chain


def test_a_young_acceptance_mean_is_not_refilled_where_the_shape_would_lose_even_accepting_its_whole_depth():
    """This stop's run at 16 requests: the tree's acceptance mean had started afresh (not drafted for a while), so the
    tree was run to refill it at the first open step at 16, where it had been probed before (5 tree steps a pass, each
    ~6 plain ones: the auto budget 0.82x-0.93x no speculation where the chain alone read 0.94x-0.99x). Even accepting
    its whole depth every round, at the least it can cost there (the chain's cost at 16: it verifies more tokens) the
    tree loses to the chain: the chain is drafted instead."""
    budget, tree, chain = tree_measured_at_one_request()
    budget.last_observed = {s: budget.steps for s in budget.shapes}
    budget.accepted[tree] = RoundMean()
    budget.accepted[tree].observe(torch.full((4,), 3.0), budget.steps)  # a fresh mean, 4 rounds: not measured
    budget.probe_batch[tree] = 16  # probed at 16 before: no probe carried into a larger load
    floor = budget.verify_seconds(chain, 16)
    assert budget.tokens_per_second(tree, 16, verify_seconds=floor, accepted=CONFIG.depth) < \
        budget.tokens_per_second(chain, 16)
    assert budget.would_lose(tree, 16, best_case=True)
    assert [budget.shape(16) for _ in range(PROBE_STEPS)] == [chain] * PROBE_STEPS


def test_the_chain_inside_a_wide_tree_is_completed_past_the_depth_the_tree_held_it_to():
    """The chain alone accepts all 3 of its nodes. A wide tree (root; 1 and 2 under it; 3 under 1; 4 under 2) holds
    its chain only to depth 2: where it accepts 1 -> 3, its chain accepted all it held and would have gone on (it
    always did alone). Counted as 2, the tree (2 accepted) would look as good as its chain, which accepts 3."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    for _ in range(MIN_ROUNDS):
        budget.record(chain, chain, *rounds(1, [1, 3, 4]), True, 0.010, 0.001, 1)
    wide = DraftTree(torch.arange(5)[None], torch.tensor([[-1, 0, 0, 1, 2]]), torch.tensor([[0, 1, 1, 2, 2]]))

    def tree_round(path: list[int]) -> float:
        """Record a round of the wide tree accepting ``path``; what its chain is counted to have accepted."""
        verdict = Verdict(torch.tensor([[0] + path + [-1]]), torch.tensor([2]), torch.zeros(1, dtype=torch.long))
        before = budget.chain_in_tree.total
        budget.record(tree, tree, wide, verdict, True, 0.010, 0.001, 1)
        return budget.chain_in_tree.total - ROUND_MEMORY * before

    assert [tree_round([1, 3]) for _ in range(MIN_ROUNDS)] == pytest.approx([3.0] * MIN_ROUNDS)
    assert budget.expected_accepted(tree) == pytest.approx(budget.accepted[chain].value * 2 / 3)
    assert tree_round([2, 4]) == 0  # it left the chain at once: nothing to complete


def test_the_tree_is_credited_the_lower_of_its_gain_as_a_ratio_and_as_a_difference():
    """In the tree's rounds it accepted 2, its chain 1.5 (4/3, +0.5). Where the chain now accepts 2.4 a round the
    tree is expected to add 0.5 (not 4/3 of 2.4 = 3.2); where the chain accepts 0.6, 4/3 of it (not 0.6 + 0.5);
    and never more than its depth."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    for path in ([1, 3, 4], [2]) * MIN_ROUNDS:  # tree 3 and 1, its chain 3 and 0
        budget.record(tree, tree, *rounds(1, path), True, 0.012, 0.001, 1)
    for chain_now, expected in ((2.4, 2.9), (0.6, 0.8), (3.0, CONFIG.depth)):
        budget.accepted[chain] = RoundMean()
        budget.accepted[chain].observe(torch.full((100,), chain_now), budget.steps)
        assert budget.expected_accepted(tree) == pytest.approx(expected, rel=0.02)


def run_in_turn(budget: TreeBudget, verify_seconds: dict, batch: int = 1) -> None:
    """Each shape chosen and run for 20 steps of ``batch`` requests, in the dict's order: ``verify_seconds`` a step
    besides its 1 ms of drafting."""
    for s, seconds in verify_seconds.items():
        budget.current = s
        for _ in range(20):
            budget.record(s, s, None, None, True, seconds + 0.001, 0.001, batch)


def test_a_slow_spell_seen_only_by_the_shape_being_run_does_not_make_the_others_look_cheaper():
    """The tree (3 accepted a round, 14 ms a step) loses narrowly to the chain (2, 10 ms). Then this machine slows
    down 2x while the chain runs: its steps cost 20 ms, and the tree, not run, was measured in the fast spell. The
    budget reads the spell off the chain's line (the machine drifted 2x since the tree ran) and keeps the chain: the
    tree would cost 28 ms now."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    seed_acceptance(budget, tree=3, chain=2)
    run_in_turn(budget, {tree: 0.014, NONE: 0.010, chain: 0.010})
    before = budget.tokens_per_second(tree, 1) / budget.tokens_per_second(chain, 1)
    assert before < 1 and budget.shape(1) == chain
    for _ in range(60):
        budget.record(chain, chain, None, None, True, 0.022, 0.002, 1)
    assert budget.drift(tree, 1) == pytest.approx(2, rel=0.1) and budget.drift(chain, 1) == 1
    assert budget.tokens_per_second(tree, 1) / budget.tokens_per_second(chain, 1) == pytest.approx(before, rel=0.12)
    assert budget.shape(1) == chain


def test_a_shape_just_chosen_is_read_through_the_drift_that_chose_it_until_its_own_steps_are_measured():
    """No speculation and the chain were last run side by side in a slow spell (10 and 20 ms a step); the chain runs
    on as the machine speeds up 2x, so no speculation is read at about 5 ms. When the chain's acceptance falls to 0.5
    a round, no speculation wins and is chosen. Its own line still holds the slow spell's 10 ms until its steps are
    measured (the switch's steps are not): read as it stands, the chain would win back at once, and the budget would
    alternate (run I at one request: 8 steps). Read through the drift that chose it, it is kept, and is still kept
    once its own steps, at 5 ms, are read and every other shape's drift is carried across to its line."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    seed_acceptance(budget, tree=1, chain=1.5)
    run_in_turn(budget, {tree: 0.060, NONE: 0.010, chain: 0.020})
    verify_seconds = {tree: 0.030, chain: 0.010, NONE: 0.005}  # the machine 2x faster from here on
    drafted, last = [], chain
    for step in range(80):
        if step == 60:
            budget.accepted[chain] = RoundMean()
            budget.accepted[chain].observe(torch.full((100,), 0.5), budget.steps)
        s = budget.shape(1)
        budget.record(last, s, None, None, True, verify_seconds[last] + 0.001, 0.001, 1)
        drafted.append(s)
        last = s
    assert drafted[:60] == [chain] * 60
    assert drafted[60:] == [NONE] * 20, drafted[60:]
    assert budget.reference == NONE and budget.drift(chain, 1) == pytest.approx(1, rel=0.1)


def test_a_probe_of_the_reference_does_not_move_the_drift_that_chose_another_shape():
    """Run W at 32 requests: no speculation was chosen at a wave's first step, the chain still the drift's reference.
    A probe of the chain followed at once; its three steps read 17.3 ms against the 15.8 of its last pass, so no
    speculation's drift read 1.15, and the chain, 1.1x ahead by that alone, was drafted through the wave. Until no
    speculation's own steps are read, the drift stays the one that chose it."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    seed_acceptance(budget, tree=1.0, chain=1.0)
    run_in_turn(budget, {tree: 0.060, NONE: 0.008, chain: 0.018}, batch=32)
    assert budget.reference == chain and budget.shape(32) == NONE  # 32 tokens in 8 ms against 64 in 19
    budget.accepted[chain] = RoundMean()  # the next wave's prompts: the chain accepts more
    budget.accepted[chain].observe(torch.full((MIN_ROUNDS,), 1.4), budget.steps)
    budget.steps += STALE_STEPS + 1  # the chain's steps at 32 are stale: its probe's three steps replace them
    budget.last_verified = chain
    for _ in range(MIN_OBSERVATIONS):
        budget.record(chain, chain, None, None, True, 0.0198 + 0.001, 0.001, 32)
    assert budget.verify_cost[chain](32) == pytest.approx(0.0198)  # 10% dearer than its last pass
    assert budget.drift(NONE, 32) == pytest.approx(1.0)  # read 1.1 from the probe, it put the chain ahead by 1.1x
    assert budget.best(32) == NONE  # 32 tokens in 9 ms against 76.8 in 20.8: the chain is not 1.1x as fast


def test_the_drift_is_read_at_a_neighbouring_bucket_where_only_it_is_covered():
    """Run U2 at ~16 requests: the chain was last measured at 16 alone, beside no speculation's steps there; no
    speculation then ran on, at 15 and 16 requests, in a spell 1.3x slower. Its line had covered 16 only, so its
    first steps at 15, already slow, became the chain's reference there: the drift read 1.3 at 16 and 1 at 15, and
    the chain, losing at 16, looked ahead at 15; the budget alternated as the batch moved between the two. The drift
    at 15 is now read at 16, the nearest batch both lines cover: the same on both sides, and so is the choice."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    seed_acceptance(budget, tree=0.7, chain=0.6)
    run_in_turn(budget, {tree: 0.060, NONE: 0.008, chain: 0.014}, batch=16)
    budget.current = NONE
    for step in range(60):
        batch = 15 + step % 2
        budget.record(NONE, NONE, None, None, True, 0.0104 + 0.001, 0.001, batch)
    assert budget.reference == NONE and budget.verify_cost[NONE].covers(15)
    assert not budget.lines_when_seen[chain][NONE].covers(15)  # no speculation's line when the chain ran
    assert budget.drift(chain, 16) > 1.2  # its line at 16 nearly all the slow spell's
    assert budget.drift(chain, 15) == pytest.approx(budget.drift(chain, 16))
    assert budget.best(15) == budget.best(16) == NONE  # 1.6 tokens in ~19.5 ms against 1 in ~11.4, either side


@pytest.mark.parametrize("warming", [False, True])
def test_steps_slowed_just_after_the_engine_idled_are_not_read_as_the_shapes_cost(warming):
    """The demo's run 22: the chain (2 accepted a round, 10 ms a step) runs; after another server's turn the first
    ~20 steps run 2.6x slow. Read as the chain's cost (``warming`` unknown, as before), they make no speculation,
    probed at its usual 6 ms just after, look 1.4x faster, and the chain is not drafted again for hundreds of steps.
    Flagged as steps after an idle gap, the slow ones are not read; one at the expected speed is."""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    seed_acceptance(budget, tree=1.0, chain=2.0)
    run_in_turn(budget, {tree: 0.015, NONE: 0.006, chain: 0.010})
    assert budget.best(1) == chain  # 3 tokens in 11 ms against 1 in 7
    observations = budget.verify_cost[chain].observations
    for _ in range(20):
        budget.record(chain, chain, None, None, True, 2.6 * 0.011, 0.0026, 1, warming=warming)
    if warming:
        assert budget.verify_cost[chain].observations == observations and budget.draft_scale[chain] == 1.0
        budget.record(chain, chain, None, None, True, 0.9 * WARM_SLOW * 0.011, 0.001, 1, warming=True)
        assert budget.verify_cost[chain].observations == observations + 1  # at about the speed expected: read
    for _ in range(5):  # no speculation's probe, at its usual cost
        budget.record(NONE, NONE, None, None, True, 0.007, 0.001, 1, warming=warming)
    assert budget.best(1) == (chain if warming else NONE)


@pytest.mark.parametrize("seed", range(4))
def test_noise_in_the_shape_being_run_does_not_move_the_estimates_of_the_others(seed):
    """The chain runs 3,000 steps whose cost is noise about a steady 10 ms (log-normal, sd 0.3); the tree and no
    speculation were last run at 14 and 9 ms. Their estimates stay near those: only a lasting change in the chain's
    cost is read as the machine's. (The slowdown this replaced, split from the chain's own line by the same steps,
    ratcheted under such noise: a median 4.7x over 20 seeds, the others' estimates with it.)"""
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    seed_acceptance(budget, tree=3, chain=2)
    run_in_turn(budget, {tree: 0.014, NONE: 0.009, chain: 0.010})
    noise = torch.distributions.LogNormal(0.0, 0.3)
    torch.manual_seed(seed)
    estimates = []
    for step in range(3000):
        budget.record(chain, chain, None, None, True, 0.010 * float(noise.sample()) + 0.001, 0.001, 1)
        if step % 100 == 99:
            estimates.append((budget.verify_seconds(tree, 1) / 0.014, budget.verify_seconds(NONE, 1) / 0.009))
    mean_noise = float(noise.mean)  # the chain's line follows the mean of its steps, 1.046x the median
    assert all(0.75 < ratio / mean_noise < 1.35 for pair in estimates for ratio in pair), estimates


def test_the_budget_logs_why_it_drafts_what_it_drafts(tmp_path, monkeypatch):
    """``EAGLE3_BUDGET_LOG``: a line at every change of the shape drafted or of a closed batch and every LOG_EVERY
    steps, with each shape's expectations once it is measured."""
    path = tmp_path / "budget.jsonl"
    monkeypatch.setenv(LOG_ENV, str(path))
    budget = TreeBudget(CONFIG, {s: Line(0.001) for s in TreeBudget(CONFIG).shapes})
    tree, chain = budget.shapes[:2]
    drafted = []
    for _ in range(LOG_EVERY + MIN_ROUNDS):
        shape = budget.shape(1)
        drafted.append(shape)
        trees, verdict = rounds(1, [1, 3] if shape != NONE else [])
        budget.record(shape, shape, trees if shape != NONE else None, verdict if shape != NONE else None, True,
                      {tree: 0.030, chain: 0.010, NONE: 0.008}[shape], 0.001, 1)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    changes = [i + 1 for i in range(len(drafted)) if i == 0 or drafted[i] != drafted[i - 1]]
    assert sorted({line["step"] for line in lines}) == sorted(set(changes) | {LOG_EVERY})
    last = lines[-1]
    assert set(last["shapes"]) == {"tree 3/2/5", "chain 3", "none"} and last["batch"] == 1 and not last["closed"]
    assert last["shapes"]["chain 3"]["accepted"] == pytest.approx(2)  # measured: its expectations are there
    assert last["shapes"]["chain 3"]["tokens_per_s"] > last["shapes"]["tree 3/2/5"]["tokens_per_s"]
    assert TreeBudget(Eagle3Config(draft="unused", depth=3, top_k=2, total_tokens=5, budget="fixed")).log is None

    # What the demo prints: each shape's share of the steps the log covers, read back exactly.
    covered, shares = drafted_shares(str(path))
    first, final = lines[0]["step"], lines[-1]["step"]
    assert covered == final - first + 1 and len(set(drafted[first - 1:final])) > 1
    assert shares == pytest.approx({label: sum(s.label == label for s in drafted[first - 1:final]) / covered
                                    for label in last["shapes"]})
    assert drafted_summary(str(path), "ours") == (f"ours drafted, over the {covered} steps its log covers: "
                                                  + ", ".join(f"{k} on {v:.0%}" for k, v in shares.items()))

    # A batch judged closed has a line at once, though it drafts the shape the last step drafted.
    budget.log.write(budget, 2, drafted[-1], Wave(["a", "b"], lambda: torch.tensor([40, 40]), 1))
    closed = json.loads(path.read_text().splitlines()[-1])
    assert closed["closed"] and closed["batch"] == 2 and closed["drafted"] == drafted[-1].label

    with open(path, "a") as f:  # a second budget's lines in the same file: refused, not miscounted
        f.write(json.dumps(dict(lines[0])) + "\n")
    with pytest.raises(Eagle3Error, match="more than one budget"):
        drafted_shares(str(path))
    assert drafted_summary(str(path), "ours").startswith("what ours drafted is not known: ")
