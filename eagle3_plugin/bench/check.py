"""``eagle3 check``: compare a bench report with a stored baseline, fail on an acceptance regression.

- Greedy reports: fail when acceptance falls below ``baseline x (1 - rtol)`` or greedy outputs stop matching.
- Reports at T > 0: acceptance is a random quantity; fail only when the drop of the mean acceptance length is
  significant at level ``alpha`` (one-sided z-test from both reports' standard errors, ``eagle3 bench --samples``).
- ``rtol = 0``: exact mode for deterministic runs: any change of acceptance fails, up or down.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from ..errors import Eagle3Error
from ..fsutil import read_json_object

SAME_SETUP = ("engine", "mode", "temperature", "num_prompts", "concurrency")
SAME_SETTINGS = ("depth", "top_k", "total_tokens", "tree_sampler", "max_new_tokens", "samples", "max_turns")
DEFAULTS = {"concurrency": 1, "samples": 1, "max_turns": None}  # reports made before these existed


def load_report(path: str) -> dict:
    report = read_json_object(path, "report")
    for key in ("mean_acceptance_length", "acceptance_per_position", "greedy_match", "settings", "engine", "mode",
                "temperature", "num_prompts"):
        if key not in report:
            raise Eagle3Error(f"{path}: not a bench report (missing {key!r})")
    return report


def compare(report: dict, baseline: dict, rtol: float, alpha: float = 0.01) -> tuple[bool, str]:
    """``(ok, table)``."""
    mismatched = [k for k in SAME_SETUP + SAME_SETTINGS if _get(report, k) != _get(baseline, k)]
    if mismatched:
        raise Eagle3Error("report and baseline were measured differently: " + ", ".join(
            f"{k} {_get(baseline, k)!r} vs {_get(report, k)!r}" for k in mismatched))
    if rtol < 0 or not 0 < alpha < 1:
        raise Eagle3Error(f"--rtol must be >= 0 and --alpha in (0, 1), got {rtol} and {alpha}")
    if report["mean_acceptance_length"] is None or baseline["mean_acceptance_length"] is None:
        raise Eagle3Error("a report without acceptance (no speculative counters) cannot be checked")
    rows, ok = [], True

    def row(name, base, now, failed, note=""):
        nonlocal ok
        ok &= not failed
        change = f"{(now - base) / base:+.1%}" if isinstance(base, float) and base else ""
        status = "FAIL" if failed else ("ok" if failed is not None else "info")
        rows.append(f"| {name} | {_fmt(base)} | {_fmt(now)} | {change} | {status}{note} |")

    base_mal, now_mal = baseline["mean_acceptance_length"], report["mean_acceptance_length"]
    positions = list(zip(baseline["acceptance_per_position"], report["acceptance_per_position"]))
    if rtol == 0:
        rule = "exact: any change fails"
        row("drafting_rounds", baseline.get("drafting_rounds"), report.get("drafting_rounds"),
            baseline.get("drafting_rounds") != report.get("drafting_rounds"))
        row("mean_acceptance_length", base_mal, now_mal, now_mal != base_mal)
        for i, (base, now) in enumerate(positions):
            row(f"acceptance position {i + 1}", base, now, now != base)
    elif report["temperature"] > 0:
        se_now, se_base = report.get("mean_acceptance_length_se"), baseline.get("mean_acceptance_length_se")
        if se_now is None or se_base is None:
            raise Eagle3Error("a T>0 check needs each report's standard error: bench with --samples (or more than "
                              "one prompt) so every request reports its own acceptance")
        z = (now_mal - base_mal) / math.sqrt(se_now ** 2 + se_base ** 2) if se_now or se_base else 0.0
        p = NormalDist().cdf(z)
        rule = f"T>0: fail on a drop significant at alpha={alpha} (one-sided z-test)"
        row("mean_acceptance_length", base_mal, now_mal, p < alpha, f" (z={z:+.2f}, p={p:.2g})")
        for i, (base, now) in enumerate(positions):
            row(f"acceptance position {i + 1}", base, now, None)
    else:
        rule = f"greedy: fail below baseline x (1 - {rtol})"
        floor = 1.0 - rtol
        row("mean_acceptance_length", base_mal, now_mal, now_mal < base_mal * floor)
        for i, (base, now) in enumerate(positions):
            row(f"acceptance position {i + 1}", base, now, now < base * floor)
    if baseline["greedy_match"] is not None:
        row("greedy_match", baseline["greedy_match"], report["greedy_match"],
            baseline["greedy_match"] and not report["greedy_match"])
    header = ["| metric | baseline | report | change | status |", "|---|---:|---:|---:|:---:|"]
    verdict = "PASS" if ok else "FAIL: acceptance regressed (or greedy outputs changed)"
    return ok, "\n".join(header + rows + ["", f"rule: {rule}", verdict])


def _get(report: dict, key: str):
    if key in report:
        return report[key]
    return report["settings"].get(key, DEFAULTS.get(key))


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
