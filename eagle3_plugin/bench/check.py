"""``eagle3 check``: compare a bench report with a stored baseline, fail on an acceptance regression."""

from __future__ import annotations

from ..errors import Eagle3Error
from ..fsutil import read_json_object

SAME_SETUP = ("engine", "mode", "temperature", "num_prompts")
SAME_SETTINGS = ("depth", "top_k", "total_tokens", "tree_sampler", "max_new_tokens")


def load_report(path: str) -> dict:
    report = read_json_object(path, "report")
    for key in ("mean_acceptance_length", "acceptance_per_position", "greedy_match", "settings") + SAME_SETUP:
        if key not in report:
            raise Eagle3Error(f"{path}: not a bench report (missing {key!r})")
    return report


def compare(report: dict, baseline: dict, rtol: float) -> tuple[bool, str]:
    """``(ok, table)``: fails when acceptance drops below ``baseline * (1 - rtol)`` or greedy stops matching."""
    mismatched = [k for k in SAME_SETUP if report[k] != baseline[k]] + [
        k for k in SAME_SETTINGS if report["settings"].get(k) != baseline["settings"].get(k)]
    if mismatched:
        raise Eagle3Error("report and baseline were measured differently: " + ", ".join(
            f"{k} {_get(baseline, k)!r} vs {_get(report, k)!r}" for k in mismatched))
    rows, ok = [], True

    def row(name, base, now, failed):
        nonlocal ok
        ok &= not failed
        change = f"{(now - base) / base:+.1%}" if isinstance(base, float) and base else ""
        rows.append(f"| {name} | {_fmt(base)} | {_fmt(now)} | {change} | {'FAIL' if failed else 'ok'} |")

    floor = 1.0 - rtol
    row("mean_acceptance_length", baseline["mean_acceptance_length"], report["mean_acceptance_length"],
        report["mean_acceptance_length"] < baseline["mean_acceptance_length"] * floor)
    for i, (base, now) in enumerate(zip(baseline["acceptance_per_position"], report["acceptance_per_position"])):
        row(f"acceptance position {i + 1}", base, now, now < base * floor)
    if baseline["greedy_match"] is not None:
        row("greedy_match", baseline["greedy_match"], report["greedy_match"],
            baseline["greedy_match"] and not report["greedy_match"])
    header = ["| metric | baseline | report | change | status |", "|---|---:|---:|---:|:---:|"]
    verdict = "PASS" if ok else f"FAIL: acceptance regressed beyond rtol={rtol} (or greedy outputs changed)"
    return ok, "\n".join(header + rows + ["", verdict])


def _get(report: dict, key: str):
    return report[key] if key in report else report["settings"].get(key)


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
