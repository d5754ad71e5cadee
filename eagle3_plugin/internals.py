"""Checking an engine's internals before patching them (shared by the vLLM and SGLang integrations)."""

from __future__ import annotations

import importlib
import inspect

# (module, attribute path, parameter names relied on, or None / () for "exists")
Internal = tuple[str, str, "tuple[str, ...] | None"]


def internal_problems(required: tuple[Internal, ...]) -> list[str]:
    """One line per internal in ``required`` that is missing or lacks a parameter we pass or read."""
    problems = []
    for module_name, path, params in required:
        where = f"{module_name}.{path}"
        try:
            obj = importlib.import_module(module_name)
            for part in path.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            problems.append(f"{where} is missing ({e})")
            continue
        if params:
            have = set(inspect.signature(obj).parameters)
            missing = [p for p in params if p not in have]
            if missing:
                problems.append(f"{where} lacks parameter(s) {', '.join(missing)}")
    return problems


def check_engine(engine: str, version: str, supported: tuple[str, ...], required: tuple[Internal, ...],
                 error: type[Exception]) -> str:
    """Return ``version`` if it is ``supported`` and every internal in ``required`` is there; else raise ``error``
    listing every problem at once."""
    problems = internal_problems(required)
    if version not in supported:
        problems.insert(0, f"{engine} {version} is not supported (supported: {', '.join(supported)})")
    if problems:
        raise error(f"eagle3-plugin cannot run on this {engine}: " + "; ".join(problems))
    return version
