"""The benchmark report: JSON fields, Markdown summary and the per-position / per-category plot."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

from ..reference import AcceptanceStats


@dataclass
class PromptResult:
    category: Optional[str]
    spec_tokens: list
    base_tokens: list
    spec_seconds: float
    base_seconds: float
    stats: AcceptanceStats


def summarize(results: list[PromptResult], depth: int) -> dict:
    """Aggregate figures for a set of prompts (acceptance, speed, greedy agreement)."""
    stats = AcceptanceStats(depth)
    for r in results:
        stats.merge(r.stats)
    spec_tokens = sum(len(r.spec_tokens) for r in results)
    base_tokens = sum(len(r.base_tokens) for r in results)
    spec_s = sum(r.spec_seconds for r in results)
    base_s = sum(r.base_seconds for r in results)
    tps = spec_tokens / spec_s if spec_s else 0.0
    base_tps = base_tokens / base_s if base_s else 0.0
    return {
        "num_prompts": len(results),
        "generated_tokens": spec_tokens,
        "drafting_rounds": stats.rounds,
        "mean_acceptance_length": stats.mean_acceptance_length,
        "acceptance_per_position": stats.acceptance_rate_per_position,
        "tokens_per_s": tps,
        "baseline_tokens_per_s": base_tps,
        "speedup": tps / base_tps if base_tps else None,
        "outputs_match": all(r.spec_tokens == r.base_tokens for r in results),
    }


def build_report(results: list[PromptResult], *, engine: str, mode: str, temperature: float, depth: int,
                 settings: dict) -> dict:
    report = {"engine": engine, "mode": mode, "temperature": temperature, **summarize(results, depth)}
    matched = report.pop("outputs_match")
    report["greedy_match"] = matched if temperature == 0 else None
    by_category = defaultdict(list)
    for r in results:
        if r.category is not None:
            by_category[r.category].append(r)
    if by_category:
        report["categories"] = {}
        for name, rs in sorted(by_category.items()):
            figures = summarize(rs, depth)
            figures.pop("outputs_match")
            report["categories"][name] = figures
    report["settings"] = settings
    return report


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [
        f"## eagle3 bench: {report['engine']}, {report['mode']} (depth {s['depth']}, top_k {s['top_k']}, "
        f"{s['total_tokens']} tokens/round), T={report['temperature']}",
        "",
        "| prompts | tokens | mean acceptance length | tokens/s (spec) | tokens/s (no spec) | speedup | greedy match |",
        "|---:|---:|---:|---:|---:|---:|:---:|",
        f"| {report['num_prompts']} | {report['generated_tokens']} | {report['mean_acceptance_length']:.3f} | "
        f"{report['tokens_per_s']:.1f} | {report['baseline_tokens_per_s']:.1f} | {_x(report['speedup'])} | "
        f"{'n/a' if report['greedy_match'] is None else ('yes' if report['greedy_match'] else 'NO')} |",
        "",
        "Acceptance per position: " + ", ".join(f"{p:.3f}" for p in report["acceptance_per_position"]),
    ]
    if report.get("categories"):
        lines += ["", "| category | prompts | mean acceptance length | speedup |", "|---|---:|---:|---:|"]
        for name, c in report["categories"].items():
            lines.append(f"| {name} | {c['num_prompts']} | {c['mean_acceptance_length']:.3f} | {_x(c['speedup'])} |")
    return "\n".join(lines)


def _x(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = report.get("categories") or {}
    fig, axes = plt.subplots(1, 2 if categories else 1, figsize=(11 if categories else 6, 4), squeeze=False)
    ax = axes[0, 0]
    rates = report["acceptance_per_position"]
    ax.bar(range(1, len(rates) + 1), rates, color="tab:blue")
    ax.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1),
           title=f"{report['engine']} {report['mode']}: mean acceptance length {report['mean_acceptance_length']:.2f}")
    if categories:
        ax = axes[0, 1]
        names = list(categories)
        ax.barh(names, [categories[n]["mean_acceptance_length"] for n in names], color="tab:orange")
        ax.set(xlabel="mean acceptance length", title="by category")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
