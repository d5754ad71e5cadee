"""The core on a GPU, no engine: greedy identity on CUDA, then the batched speculator's step by batch, and the bound.

No engine can run on the GPU machine this project is sometimes lent (vLLM's and SGLang's CUDA builds are not
there, and nothing can be fetched), so this checks what README's "What the GPU path needs next" says of the core:

1. **Correct on the device**: the reference generator's greedy tree and chain equal plain greedy decoding on the
   same device (bundled checkpoint, batch 1 and 8), and a T=1 tree runs.
2. **The step**: ``Speculator.step`` for a decode step (``--context`` stored positions a row, one new entry) at
   each batch, for the bundled draft (fp32) and a draft shaped like Llama-3.1-8B's EAGLE-3 draft (bf16, random
   weights): device time per step (CUDA events, median), host time to issue it, host syncs (and where) and
   kernels per step.
3. **CUDA graphs**: one tree level's draft forward (``expand``) replayed from a graph against eager.
4. **The bound**: an 8B Llama-shaped target's weight GEMMs (32 layers and the LM head, bf16) for the tokens one
   step verifies, the least its forward costs, beside which the draft's step is overhead.

    python benchmarks/cuda_core.py [--device cuda] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter

import torch

from eagle3_plugin import speculator as speculator_module
from eagle3_plugin.checkpoint import load_draft
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.draft import DraftConfig, Eagle3Draft
from eagle3_plugin.reference import SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams
from eagle3_plugin.speculator import DraftKV, DraftRows, Speculator, TreeShape

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# Llama-3.1-8B-Instruct's EAGLE-3 draft: one Llama layer of the target's width, a 32k draft vocabulary.
LLAMA_8B_DRAFT = DraftConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                             head_dim=128, vocab_size=128256, draft_vocab_size=32000, target_hidden_size=4096,
                             rope_theta=500000.0, max_position_embeddings=8192)
LLAMA_8B_LAYERS = 32


def greedy_identity(device: str, num_prompts: int, new_tokens: int) -> bool:
    """Section 1: speculative greedy (tree, chain) equals plain greedy on ``device``, batch 1 and ``num_prompts``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    target_dir = os.path.join(ROOT, "checkpoints/target")
    base = Eagle3Config.load(os.path.join(ROOT, "checkpoints/draft"))
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    prompts = [encode_prompt(tokenizer, r.prompt) for r in read_prompts(
        os.path.join(ROOT, "checkpoints/prompts/heldout.jsonl"))[:num_prompts]]
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, attn_implementation="sdpa")
    gen = SpeculativeGenerator(target.to(device), load_draft(base.draft).to(device), base)
    chain = Eagle3Config.chain(base.depth, draft=base.draft, layer_ids=base.layer_ids)
    ok = True
    print(f"## 1. Greedy identity on {device} (bundled checkpoint, {new_tokens} new tokens)\n")
    print("| setting | batch | identical to plain greedy | mean acceptance length |")
    print("|---|---:|---|---:|")
    for batch in sorted({1, num_prompts}):
        plain = gen.generate_baseline(prompts[:batch], new_tokens, SamplingParams.uniform(batch, device=device)).tokens
        for name, config in (("tree", base), ("chain", chain)):
            gen.config = config
            out = gen.generate(prompts[:batch], new_tokens, SamplingParams.uniform(batch, device=device))
            same = out.tokens == plain
            ok &= same
            print(f"| {name} | {batch} | {'yes' if same else 'NO'} | {out.stats.mean_acceptance_length:.3f} |")
    gen.config = base
    sampled = gen.generate(prompts[:num_prompts], new_tokens, SamplingParams.uniform(num_prompts, 1.0, device=device))
    print(f"| tree, T=1 | {num_prompts} | (sampled) | {sampled.stats.mean_acceptance_length:.3f} |\n")
    return ok


class _Timed:
    """One ``Speculator.step`` cell: a draft, a batch, a shape, ``context`` positions stored a row."""

    def __init__(self, draft: Eagle3Draft, config: Eagle3Config, batch: int, shape: TreeShape, context: int,
                 device: str):
        c = draft.config
        self.speculator = Speculator(draft, config)
        dtype = next(draft.parameters()).dtype
        self.kv = DraftKV.allocate(batch * (context + 1), c.num_key_value_heads, c.head_dim, dtype, device)
        self.kv.keys.normal_()
        self.kv.values.normal_()
        slots = torch.arange(batch * (context + 1), device=device).view(batch, context + 1)
        self.rows = DraftRows(slots, torch.full((batch,), context, device=device),
                              torch.ones(batch, dtype=torch.long, device=device),
                              torch.randint(c.vocab_size, (batch, 1), device=device),
                              torch.randn(batch, 1, 3 * c.target_hidden_size, dtype=dtype, device=device))
        self.params = SamplingParams.uniform(batch, device=device)
        self.shape = shape

    def __call__(self):
        return self.speculator.step(self.kv, self.rows, self.params, None, self.shape)


def _median_ms(fn, steps: int, device: str) -> tuple[float, float]:
    """Median device and host milliseconds of ``fn`` (host: to issue it; CPU: both the wall time)."""
    for _ in range(3):
        fn()
    device_ms, host_ms = [], []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
            began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            began.record()
            t = time.perf_counter()
            fn()
            host_ms.append(1e3 * (time.perf_counter() - t))
            ended.record()
            ended.synchronize()
            device_ms.append(began.elapsed_time(ended))
        else:
            t = time.perf_counter()
            fn()
            host_ms.append(1e3 * (time.perf_counter() - t))
            device_ms.append(host_ms[-1])
    return statistics.median(device_ms), statistics.median(host_ms)


def _syncs_and_kernels(fn) -> tuple[Counter, int]:
    """Host syncs by source line (CUDA's sync debug mode) and GPU kernels (the profiler) in one call of ``fn``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = Counter(f"{os.path.basename(w.filename)}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return syncs, sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def step_times(drafts: dict, batches: list[int], shapes: dict, context: int, steps: int, device: str) -> None:
    """Section 2."""
    print(f"## 2. Speculator.step on {device}: one decode step, {context} positions stored a row\n")
    print("| draft | shape | batch | device ms | host ms | host syncs | kernels |")
    print("|---|---|---:|---:|---:|---:|---:|")
    sites = {}
    for name, (draft, config) in drafts.items():
        for shape_name, shape in shapes.items():
            at_batch_1 = None
            for batch in batches:
                cell = _Timed(draft, config, batch, shape, context, device)
                device_ms, host_ms = _median_ms(cell, steps, device)
                syncs, kernels = _syncs_and_kernels(cell) if device == "cuda" else (Counter(), -1)
                sites[shape_name] = syncs
                at_batch_1 = at_batch_1 or device_ms
                print(f"| {name} | {shape_name} | {batch} | {device_ms:.2f} ({device_ms / at_batch_1:.2f}x b1) "
                      f"| {host_ms:.2f} | {sum(syncs.values())} | {kernels} |", flush=True)
                del cell
    for shape_name, syncs in sites.items():
        print(f"\nHost syncs of one {shape_name} step: "
              + (", ".join(f"{site} x{n}" for site, n in sorted(syncs.items())) or "none counted (not on CUDA)"))
    print()


def graph_level(draft: Eagle3Draft, config: Eagle3Config, batch: int, shape: TreeShape, context: int,
                steps: int) -> None:
    """Section 3: one tree level's ``expand`` (the draft forward and its logits), eager and from a CUDA graph."""
    caught = {}
    original = speculator_module.build_tree

    def keep_expand(root_tokens, root_logits, expand, *args, **kwargs):
        caught["expand"] = expand
        return original(root_tokens, root_logits, expand, *args, **kwargs)

    cell = _Timed(draft, config, batch, shape, context, "cuda")
    speculator_module.build_tree = keep_expand
    try:
        cell()
    finally:
        speculator_module.build_tree = original
    expand = caught["expand"]
    tokens = torch.randint(draft.config.vocab_size, (batch, shape.top_k), device="cuda")
    parent_slot = torch.randint(shape.top_k, (batch, shape.top_k), device="cuda")
    with torch.no_grad():
        eager_ms, _ = _median_ms(lambda: expand(2, tokens, parent_slot), steps, "cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                expand(2, tokens, parent_slot)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            expand(2, tokens, parent_slot)
        graph_ms, _ = _median_ms(graph.replay, steps, "cuda")
    print(f"| {batch} | {eager_ms:.3f} | {graph_ms:.3f} | {eager_ms / graph_ms:.1f}x |", flush=True)


def target_bound(token_counts: list[int], steps: int) -> None:
    """Section 4: the weight GEMMs of an 8B Llama-shaped target (bf16, random weights) for ``n`` tokens."""
    c = LLAMA_8B_DRAFT
    shapes = [(c.hidden_size, (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim),
              (c.num_attention_heads * c.head_dim, c.hidden_size), (c.hidden_size, 2 * c.intermediate_size),
              (c.intermediate_size, c.hidden_size)]
    layers = [[torch.randn(n_out, n_in, dtype=torch.bfloat16, device="cuda") * 0.02 for n_in, n_out in shapes]
              for _ in range(LLAMA_8B_LAYERS)]
    lm_head = torch.randn(c.vocab_size, c.hidden_size, dtype=torch.bfloat16, device="cuda") * 0.02
    weight_bytes = 2 * (sum(w.numel() for layer in layers for w in layer) + lm_head.numel())
    print(f"## 4. The bound: an 8B Llama-shaped target's weight GEMMs ({weight_bytes / 1e9:.1f} GB of bf16 weights)\n")
    print("| tokens in the step | ms | GB/s of weights |")
    print("|---:|---:|---:|")
    for n in token_counts:
        x = {size: torch.randn(n, size, dtype=torch.bfloat16, device="cuda") for size in
             (c.hidden_size, c.intermediate_size)}

        def forward():
            for layer in layers:
                for w in layer:
                    torch.nn.functional.linear(x[w.shape[1]], w)
            torch.nn.functional.linear(x[c.hidden_size], lm_head)

        ms, _ = _median_ms(forward, steps, "cuda")
        print(f"| {n} | {ms:.2f} | {weight_bytes / ms / 1e6:.0f} |", flush=True)
    print()


def _section(fn, *args):
    """Run one section; a failure is printed and the next section still runs (one device lease, every finding)."""
    try:
        return fn(*args)
    except Exception:
        print(f"\n{fn.__name__} failed:\n{traceback.format_exc()}", flush=True)
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="small: 2 prompts, one batch, the bundled draft only")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    if a.device == "cuda":
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    identical = _section(greedy_identity, a.device, 2 if a.quick else 8, 16 if a.quick else 64)

    bundled = Eagle3Config.load(os.path.join(ROOT, "checkpoints/draft"))
    draft = load_draft(bundled.draft).to(a.device)
    draft.attach_embedding(torch.nn.Embedding(draft.config.vocab_size, draft.config.hidden_size).to(a.device))
    drafts = {"bundled (fp32)": (draft, bundled)}
    if not a.quick:
        big = Eagle3Draft(LLAMA_8B_DRAFT).to(device=a.device, dtype=torch.bfloat16)
        big.attach_embedding(torch.nn.Embedding(LLAMA_8B_DRAFT.vocab_size, LLAMA_8B_DRAFT.hidden_size).to(
            device=a.device, dtype=torch.bfloat16))
        drafts["Llama-8B-shaped (bf16)"] = (big, bundled)
    shapes = {"tree 5/8/32": TreeShape.of(bundled), "chain 5": TreeShape(bundled.depth, 1, bundled.depth + 1)}
    batches = [1] if a.quick else [1, 4, 16, 32, 64]
    _section(step_times, drafts, batches, shapes, 64 if a.quick else a.context, 3 if a.quick else a.steps, a.device)

    if a.device == "cuda":
        print("## 3. One tree level's draft forward (level 2 of 5/8/32, Llama-8B-shaped draft), eager and from a "
              "CUDA graph\n")
        print("| batch | eager ms | graph ms | eager / graph |")
        print("|---:|---:|---:|---:|")
        for batch in (1, 16, 64):
            try:
                graph_level(*drafts["Llama-8B-shaped (bf16)"], batch, shapes["tree 5/8/32"], a.context, a.steps)
            except Exception as error:  # a capture that fails is a finding, not the end of the run
                print(f"| {batch} | capture failed: {type(error).__name__}: {str(error)[:200]} | | |", flush=True)
        print()
        del drafts
        torch.cuda.empty_cache()
        _section(target_bound, [1, 6, 32, 16 * 6, 16 * 32, 64 * 32], a.steps)
    print(f"greedy identical on {a.device}: {'yes' if identical else 'NO'}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
