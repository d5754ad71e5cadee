"""The bench's arithmetic and prompts, without an engine: throughput over busy time, latency percentiles, the
standard error of the mean acceptance length (against a simulation), multi-turn prompts with and without a chat
template, ``check``'s exact mode, and which thread asks each turn."""

import json
import os
import random
import threading

import pytest
from transformers import AutoTokenizer

from bundled import BASELINES, TARGET
from eagle3_plugin.bench.engines import run_in_threads
from eagle3_plugin.bench.report import acceptance_interval, latency, throughput
from eagle3_plugin.bench.workload import Conversation, Generation, Job, Record, Workload
from eagle3_plugin.cli import main
from eagle3_plugin.reference import AcceptanceStats


def record(started, first, finished, tokens, stats=None, conversation=0, sample=0):
    job = Job(conversation, sample, None, ("q",), 0)
    return Record(job, 0, Generation([1] * tokens, "", started, first, finished, stats))


def test_throughput_counts_time_with_a_request_in_flight():
    # two overlapping requests (0-2, 1-3) then a pause, then one (10-11): busy 3 + 1 seconds
    records = [record(0, 0.5, 2, 10), record(1, 1.5, 3, 10), record(10, 10.5, 11, 20)]
    assert throughput(records) == pytest.approx(40 / 4)


def test_latency_percentiles_in_milliseconds():
    records = [record(0, 0.1 * (i + 1), 0.1 * (i + 1) + 0.01 * 9, 10) for i in range(100)]
    figures = latency(records)
    assert figures["ttft_ms"]["p50"] == pytest.approx(5050, rel=1e-9)  # mean of the 50th and 51st: 5.0 s, 5.1 s
    assert figures["ttft_ms"]["p99"] == pytest.approx(9901, rel=1e-9)
    assert figures["tpot_ms"]["p50"] == pytest.approx(10.0)  # 90 ms over the 9 tokens after the first


def _simulated_request(rng, rate):
    rounds = rng.randint(8, 20)
    accepted = [min(5, int(rng.expovariate(rate))) for _ in range(rounds)]
    return AcceptanceStats(5, rounds=rounds, accepted_tokens=sum(accepted),
                           accepted_per_position=[sum(a > d for a in accepted) for d in range(5)])


def _spread_and_mean_error(draw_run, runs=400):
    estimates, errors = [], []
    for _ in range(runs):
        records = draw_run()
        total = AcceptanceStats(5)
        for r in records:
            total.merge(r.generation.stats)
        estimates.append(total.mean_acceptance_length)
        errors.append(acceptance_interval(records))
    mean = sum(estimates) / len(estimates)
    spread = (sum((e - mean) ** 2 for e in estimates) / (len(estimates) - 1)) ** 0.5
    return spread, sum(errors) / len(errors)


def test_acceptance_standard_error_matches_the_spread_of_repeated_runs():
    """The delta-method standard error of 1 + A/R agrees with the spread of the estimate over many simulated runs:
    one request per prompt, prompts drawn anew each run (rates differ between prompts)."""
    rng = random.Random(0)
    spread, error = _spread_and_mean_error(
        lambda: [record(0, None, 1, 1, _simulated_request(rng, rng.uniform(0.2, 1.0)), conversation=i)
                 for i in range(30)])
    assert error == pytest.approx(spread, rel=0.15)


def test_acceptance_standard_error_given_the_prompts_matches_reseeded_runs():
    """Prompts sampled 3 times each: the error conditional on the prompt set agrees with the spread of runs over the
    same prompts with new seeds."""
    rng = random.Random(1)
    rates = [rng.uniform(0.2, 1.0) for _ in range(12)]
    spread, error = _spread_and_mean_error(
        lambda: [record(0, None, 1, 1, _simulated_request(rng, rate), conversation=i, sample=s)
                 for i, rate in enumerate(rates) for s in range(3)])
    assert error == pytest.approx(spread, rel=0.15)


def test_plain_multi_turn_prompt_holds_the_earlier_turn_and_answer():
    tok = AutoTokenizer.from_pretrained(TARGET)
    workload = Workload(tok, "auto")
    assert workload.template_name == "plain"  # the bundled target has no chat template
    first = workload.prompt_ids(("Write a loop.", "Now in C."), [])
    second = workload.prompt_ids(("Write a loop.", "Now in C."), ["for i in x: pass"])
    assert first == tok("Write a loop.", add_special_tokens=True)["input_ids"]
    assert second == tok("Write a loop.\n\nfor i in x: pass\n\nNow in C.", add_special_tokens=True)["input_ids"]


def test_chat_template_multi_turn_and_switched_off():
    tok = AutoTokenizer.from_pretrained(TARGET)
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    turns, answers = ("hi", "more"), ["hello"]
    ids = Workload(tok, "auto").prompt_ids(turns, answers)
    assert tok.decode(ids) == "<user>hi<assistant>hello<user>more<assistant>"
    assert Workload(tok, "none").prompt_ids(turns, answers) == tok("hi\n\nhello\n\nmore")["input_ids"]


def test_check_exact_mode_fails_on_any_change(tmp_path, capsys):
    base_path = os.path.join(BASELINES, "reference-tree.json")
    base = json.load(open(base_path))
    better = dict(base, mean_acceptance_length=base["mean_acceptance_length"] + 1e-6)
    (tmp_path / "r.json").write_text(json.dumps(better))
    assert main(["check", str(tmp_path / "r.json"), "--baseline", base_path]) == 0
    assert main(["check", str(tmp_path / "r.json"), "--baseline", base_path, "--rtol", "0"]) == 1
    assert "exact" in capsys.readouterr().out


@pytest.mark.parametrize("concurrency", [1, 3])
def test_one_request_in_flight_runs_in_the_calling_thread(concurrency):
    """A second thread's torch gets an OpenMP team of its own (the reference generator ran at 0.37x there)."""
    tok = AutoTokenizer.from_pretrained(TARGET)
    workload = Workload(tok, "none")
    conversations = [Conversation(Job(i, 0, None, ("a question", "another"), 0), workload) for i in range(4)]
    threads = set()

    def generate(prompt, seed):
        threads.add(threading.current_thread())
        return Generation([1, 2], "", 0.0, None, 1.0, None)

    records = run_in_threads(generate, conversations, concurrency)
    assert [(r.job.conversation, r.turn) for r in records] == [(i, t) for i in range(4) for t in range(2)]
    assert (threads == {threading.current_thread()}) == (concurrency == 1)
