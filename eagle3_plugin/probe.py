"""Which capture ids a draft was trained on, read from the data: ``eagle3 inspect DRAFT --target T --probe``.

One config field, two meanings: vLLM reads ``eagle_config.eagle_aux_hidden_state_layer_ids`` as written, SGLang and
SpecForge one layer lower. A draft fed the wrong layers runs without any error and accepts less. The probe runs
the draft (the reference generator, a chain) on a few prompts under each candidate reading, as recorded, one
layer lower, one higher and the target's default, and reports the mean acceptance length of each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .capture_ids import default_layer_ids, validate_layer_ids
from .config import Eagle3Config
from .errors import Eagle3Error


@dataclass
class Reading:
    name: str
    layer_ids: tuple  # ours
    mean_acceptance_length: float


def candidate_readings(recorded, num_layers: int) -> dict[str, tuple]:
    """The readings worth trying, by name (ours), the invalid ones left out."""
    candidates = {}
    if recorded is not None:
        candidates["as recorded"] = tuple(recorded)
        candidates["one layer lower"] = tuple(i - 1 for i in recorded)
        candidates["one layer higher"] = tuple(i + 1 for i in recorded)
    candidates["target's default"] = default_layer_ids(num_layers)
    valid = {}
    for name, ids in candidates.items():
        try:
            valid.setdefault(validate_layer_ids(ids, num_layers), name)
        except (Eagle3Error, ValueError):
            continue
    return {name: ids for ids, name in valid.items()}


def probe(folder: str, target_dir: str, prompts_file: str, max_prompts: int = 8, max_new_tokens: int = 48,
          depth: int = 5) -> list[Reading]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .convert import load_source
    from .datafiles import encode_prompt, read_prompts
    from .reference import AcceptanceStats, SpeculativeGenerator
    from .sampler import SamplingParams

    _, canonical, target_config = load_source(folder)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = canonical.build(torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    prompts = [encode_prompt(tokenizer, r.prompt) for r in read_prompts(prompts_file)[:max_prompts]]
    readings = []
    for name, ids in candidate_readings(canonical.layer_ids, target.config.num_hidden_layers).items():
        generator = SpeculativeGenerator(target, draft, Eagle3Config.chain(depth), layer_ids=ids)
        stats = AcceptanceStats(depth)
        for prompt in prompts:
            stats.merge(generator.generate([prompt], max_new_tokens, SamplingParams.uniform(1)).stats)
        readings.append(Reading(name, ids, stats.mean_acceptance_length))
    return readings


def format_readings(readings: list[Reading]) -> str:
    best = max(readings, key=lambda r: r.mean_acceptance_length)
    lines = ["  capture-id probe (chain, greedy; ids in our rule):"]
    lines += [f"    {r.name:18s} {list(r.layer_ids)}: mean acceptance length {r.mean_acceptance_length:.3f}"
              + ("  <- best" if r is best else "") for r in readings]
    recorded = next((r for r in readings if r.name == "as recorded"), None)
    if recorded is not None and best is not recorded and best.mean_acceptance_length > recorded.mean_acceptance_length:
        ratio = best.mean_acceptance_length / recorded.mean_acceptance_length
        lines.append(f"  WARNING: the recorded capture ids are not the best reading: {best.name} "
                     f"{list(best.layer_ids)} accepts {ratio:.2f}x as much; re-convert with --layers")
    return "\n".join(lines)
