"""The benchmark report: JSON fields, Markdown summary and the plot.

One run measures each concurrency level without and with speculation. The report's top-level figures are those of
the first level (what ``eagle3 check`` compares); ``levels`` holds every level: throughput, speedup, acceptance and
latency percentiles (time to first token, time per output token after the first)."""

from __future__ import annotations

import math
from collections import defaultdict
from statistics import NormalDist
from typing import Optional

from ..reference import AcceptanceStats

Z95 = NormalDist().inv_cdf(0.975)


def merged_stats(records: list, depth: int) -> Optional[AcceptanceStats]:
    """Acceptance over records that carry their own; None when none does."""
    own = [r.generation.stats for r in records if r.generation.stats is not None]
    if not own:
        return None
    total = AcceptanceStats(depth)
    for s in own:
        total.merge(s)
    return total


def acceptance_interval(records: list) -> Optional[float]:
    """Standard error of the mean acceptance length ``1 + A/R`` (ratio estimator, delta method, residuals
    ``e = a - rho r`` per request). When every prompt was sampled at least twice, the error is conditional on the
    prompt set (what two runs over the same prompts with other seeds differ by): ``sqrt(sum_p n_p s_p^2) / R`` with
    ``s_p^2`` the variance of ``e`` within prompt p; otherwise requests count as independent draws of prompts:
    ``sqrt(n / (n - 1) * sum(e^2)) / R``. None with fewer than 2 requests."""
    with_stats = [r for r in records if r.generation.stats is not None and r.generation.stats.rounds]
    if len(with_stats) < 2:
        return None
    rounds = sum(r.generation.stats.rounds for r in with_stats)
    rho = sum(r.generation.stats.accepted_tokens for r in with_stats) / rounds
    strata = defaultdict(list)
    for r in with_stats:
        strata[r.job.conversation, r.turn].append(r.generation.stats.accepted_tokens - rho * r.generation.stats.rounds)
    if all(len(e) >= 2 for e in strata.values()):
        variance = sum(len(e) * _sample_variance(e) for e in strata.values())
    else:
        n = len(with_stats)
        variance = n / (n - 1) * sum(e * e for es in strata.values() for e in es)
    return math.sqrt(variance) / rounds


def _sample_variance(values: list) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def _percentiles(values: list) -> dict:
    values = sorted(v for v in values if v is not None)
    if not values:
        return {"p50": None, "p99": None}

    def at(q):
        k = (len(values) - 1) * q
        lo, hi = math.floor(k), math.ceil(k)
        return 1000 * (values[lo] + (values[hi] - values[lo]) * (k - lo))
    return {"p50": at(0.5), "p99": at(0.99)}


def latency(records: list) -> dict:
    """Milliseconds: time to first token and time per output token, 50th and 99th percentiles."""
    return {"ttft_ms": _percentiles([r.generation.ttft for r in records]),
            "tpot_ms": _percentiles([r.generation.tpot for r in records])}


def throughput(records: list) -> float:
    """Generated tokens per second of time with a request in flight (the union of the requests' intervals: at
    concurrency 1 the sum of request times, under load the wall time; pauses between requests are not counted)."""
    busy, end = 0.0, float("-inf")
    for start, finish in sorted((r.generation.started, r.generation.finished) for r in records):
        busy += max(0.0, finish - max(start, end))
        end = max(end, finish)
    return sum(r.generation.num_tokens for r in records) / busy if busy > 0 else 0.0


def outputs_match(spec: list, base: list) -> bool:
    """Same request, same output: token ids when both engines returned them, else text."""
    base_by_key = {r.key: r.generation for r in base}
    for r in spec:
        a, b = r.generation, base_by_key.get(r.key)
        if b is None:
            return False
        by_tokens = a.tokens is not None and b.tokens is not None
        if (a.tokens != b.tokens) if by_tokens else (a.text != b.text):
            return False
    return True


def level_figures(concurrency: int, spec: list, base: Optional[list], depth: int, aggregate=None) -> dict:
    """One concurrency level; acceptance from the engine's aggregate count when it gives one."""
    stats = aggregate or merged_stats(spec, depth)
    tps = throughput(spec)
    base_tps = throughput(base) if base else None
    se = acceptance_interval(spec)
    mal = stats.mean_acceptance_length if stats and stats.rounds else None
    return {
        "concurrency": concurrency,
        "num_requests": len(spec),
        "generated_tokens": sum(r.generation.num_tokens for r in spec),
        "drafting_rounds": stats.rounds if stats else None,
        "mean_acceptance_length": mal,
        "mean_acceptance_length_se": se,
        "mean_acceptance_length_ci95": None if se is None or mal is None else [mal - Z95 * se, mal + Z95 * se],
        "acceptance_per_position": stats.acceptance_rate_per_position if stats and stats.rounds else None,
        "tokens_per_s": tps,
        "baseline_tokens_per_s": base_tps,
        "speedup": tps / base_tps if base_tps else None,
        "latency": latency(spec),
        "baseline_latency": latency(base) if base else None,
        "outputs_match": outputs_match(spec, base) if base else None,
    }


def category_figures(spec: list, base: Optional[list], depth: int) -> dict:
    """Per category: conversations, acceptance (requests carrying their own) and speed (sum of request times)."""
    groups = defaultdict(lambda: ([], []))
    for r in spec:
        groups[r.job.category][0].append(r)
    for r in base or []:
        groups[r.job.category][1].append(r)
    out = {}
    for name, (s, b) in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if name is None:
            continue
        stats = merged_stats(s, depth)
        tps = _request_speed(s)
        base_tps = _request_speed(b) if b else None
        out[name] = {"num_prompts": len({(r.job.conversation, r.job.sample) for r in s}),
                     "mean_acceptance_length": stats.mean_acceptance_length if stats and stats.rounds else None,
                     "acceptance_per_position": stats.acceptance_rate_per_position if stats and stats.rounds else None,
                     "speedup": tps / base_tps if base_tps else None}
    return out


def _request_speed(records: list) -> float:
    seconds = sum(r.generation.finished - r.generation.started for r in records)
    return sum(r.generation.num_tokens for r in records) / seconds if seconds else 0.0


def build_report(levels: list, categories: dict, *, engine: str, mode: str, temperature: float, num_prompts: int,
                 settings: dict) -> dict:
    first = dict(levels[0])
    matched = first.pop("outputs_match")
    report = {"engine": engine, "mode": mode, "temperature": temperature, "num_prompts": num_prompts, **first,
              "greedy_match": matched if temperature == 0 else None, "levels": levels}
    if categories:
        report["categories"] = categories
    report["settings"] = settings
    return report


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [
        f"## eagle3 bench: {report['engine']}, {report['mode']} (depth {s['depth']}, top_k {s['top_k']}, "
        f"{s['total_tokens']} tokens/round, {s['budget']} budget), T={report['temperature']}, "
        f"{report['num_prompts']} prompts x {s['samples']} sample(s), {s['max_new_tokens']} new tokens",
        "",
        "| in flight | requests | tokens/s (spec) | tokens/s (no spec) | speedup | mean acceptance length | "
        "TTFT p50/p99 ms | TPOT p50/p99 ms (spec) | TPOT p50/p99 ms (no spec) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lv in report["levels"]:
        base = lv["baseline_latency"] or {"tpot_ms": {}}
        lines.append(
            f"| {lv['concurrency']} | {lv['num_requests']} | {lv['tokens_per_s']:.1f} | "
            f"{_f(lv['baseline_tokens_per_s'], '.1f')} | {_x(lv['speedup'])} | {_mal(lv)} | "
            f"{_pair(lv['latency']['ttft_ms'])} | {_pair(lv['latency']['tpot_ms'])} | {_pair(base['tpot_ms'])} |")
    match = report["greedy_match"]
    lines += ["", f"Greedy outputs identical to no speculation: {'n/a' if match is None else 'yes' if match else 'NO'}"]
    if report["acceptance_per_position"]:
        lines.append("Acceptance per position: " + ", ".join(f"{p:.3f}" for p in report["acceptance_per_position"]))
    if report.get("categories"):
        lines += ["", f"| category (in flight {report['concurrency']}) | prompts | mean acceptance length | speedup |",
                  "|---|---:|---:|---:|"]
        for name, c in report["categories"].items():
            lines.append(f"| {name} | {c['num_prompts']} | {_f(c['mean_acceptance_length'], '.3f')} | "
                         f"{_x(c['speedup'])} |")
    return "\n".join(lines)


def _mal(level: dict) -> str:
    text = _f(level["mean_acceptance_length"], ".3f")
    ci = level["mean_acceptance_length_ci95"]
    return text if ci is None else f"{text} [{ci[0]:.3f}, {ci[1]:.3f}]"


def _pair(p: dict) -> str:
    return "n/a" if p.get("p50") is None else f"{p['p50']:.1f} / {p['p99']:.1f}"


def _f(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _x(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def plot(report: dict, path: str) -> None:
    """Acceptance per position; speedup against concurrency for a sweep; acceptance per category."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = {n: c for n, c in (report.get("categories") or {}).items() if c["mean_acceptance_length"]}
    sweep = len(report["levels"]) > 1
    panels = 1 + sweep + bool(categories)
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
    axes = list(axes[0])
    ax = axes.pop(0)
    rates = report["acceptance_per_position"] or []
    ax.bar(range(1, len(rates) + 1), rates, color="tab:blue")
    ax.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1),
           title=f"{report['engine']} {report['mode']}: mean acceptance length "
                 f"{_f(report['mean_acceptance_length'], '.2f')}")
    if sweep:
        ax = axes.pop(0)
        xs = [lv["concurrency"] for lv in report["levels"]]
        ax.plot(xs, [lv["speedup"] or 0 for lv in report["levels"]], marker="o", color="tab:green")
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set(xscale="log", xticks=xs, xticklabels=[str(x) for x in xs], xlabel="requests in flight",
               ylabel="speedup vs no speculation", title="speedup under load")
    if categories:
        ax = axes.pop(0)
        names = list(categories)
        ax.barh(names, [categories[n]["mean_acceptance_length"] for n in names], color="tab:orange")
        ax.set(xlabel="mean acceptance length", title="by category")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
