"""Conversion throughput against a plain copy of the same bytes, and peak memory against the largest
tensor, on a synthetic EAGLE-3 draft shaped like a Llama-3.1-8B head (about 1.7 GB in float32).

    .venv/bin/python benchmarks/convert_throughput.py [--workdir DIR]

One run, side by side: the source weights copied in the kernel (`shutil.copyfile`) and through user
space (read + write, what any converter has to do), then `eagle3 convert --to speculators`
(every tensor read, NaN-checked, renamed and streamed to a new safetensors file) in a child process
whose peak RSS is measured; also the peak RSS of a child that only imports the same modules.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.draft import DraftConfig, Eagle3Draft
from eagle3_plugin.weights import LazyTensor, write_safetensors

HEAD = DraftConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                   head_dim=128, vocab_size=128256, draft_vocab_size=32000, target_hidden_size=4096)


def synthetic_draft(folder: str) -> tuple[int, int]:
    """Write the synthetic draft tensor by tensor; return (total bytes, largest tensor bytes)."""
    import json
    os.makedirs(folder)
    with torch.device("meta"):
        shapes = {k: (tuple(v.shape), v.dtype) for k, v in Eagle3Draft(HEAD).state_dict().items()}
    hot = torch.arange(HEAD.draft_vocab_size) * 4
    special = {"d2t": hot - torch.arange(HEAD.draft_vocab_size),
               "t2d": torch.zeros(HEAD.vocab_size, dtype=torch.bool).index_fill_(0, hot, True)}

    def make(name, shape):
        return lambda: special[name] if name in special else torch.randn(shape) * 0.02
    tensors = {k: LazyTensor(shape, dtype, make(k, shape)) for k, (shape, dtype) in shapes.items()}
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors, metadata={"format": "pt"})
    config = HEAD.to_json_dict() | {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    Eagle3Config(layer_ids=(2, 16, 29)).save(os.path.join(folder, "eagle3.json"))
    return sum(t.nbytes for t in tensors.values()), max(t.nbytes for t in tensors.values())


def child_peak_rss(setup: str, code: str) -> tuple[float, int]:
    """(seconds of ``code`` after ``setup``, peak RSS bytes) of a Python child, from its own VmHWM
    (which, unlike ru_maxrss, does not carry the parent's RSS across fork + exec)."""
    timed = (f"{setup}\nimport time\nstart = time.perf_counter()\n{code}\nprint(time.perf_counter() - start)\n"
             "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])")
    out = subprocess.run([sys.executable, "-c", timed], check=True, capture_output=True, text=True).stdout.split()
    return float(out[-2]), int(out[-1]) * 1024


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default=None)
    a = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="eagle3-convert-bench-", dir=a.workdir)
    try:
        src = os.path.join(work, "src")
        total, largest = synthetic_draft(src)
        weights = os.path.join(src, "model.safetensors")
        start = time.perf_counter()
        shutil.copyfile(weights, os.path.join(work, "copy.safetensors"))  # in-kernel (copy_file_range)
        kernel_copy_s = time.perf_counter() - start
        start = time.perf_counter()
        with open(weights, "rb") as a, open(os.path.join(work, "copy2.safetensors"), "wb") as b:
            shutil.copyfileobj(a, b, 16 << 20)  # through user space, as any converter must
        copy_s = time.perf_counter() - start
        setup = "from eagle3_plugin.convert import convert"
        _, import_rss = child_peak_rss(setup, "pass")
        out = os.path.join(work, "out")
        convert_s, convert_rss = child_peak_rss(setup, f"convert({src!r}, 'speculators', {out!r})")
        gb = 1e9
        print(f"## eagle3 convert on a synthetic {total / gb:.2f} GB draft (Llama-3.1-8B head shape, float32)\n")
        print("| | seconds | GB/s |")
        print("|---|---:|---:|")
        print(f"| plain copy in the kernel (shutil.copyfile) | {kernel_copy_s:.2f} | "
              f"{total / gb / kernel_copy_s:.2f} |")
        print(f"| plain copy through user space (read + write) | {copy_s:.2f} | {total / gb / copy_s:.2f} |")
        print(f"| eagle3 convert ours -> speculators | {convert_s:.2f} | {total / gb / convert_s:.2f} |")
        print(f"\nconvert / user-space copy time: {convert_s / copy_s:.2f}x (convert reads every tensor, checks it for "
              "NaN/Inf, renames it and writes it; imports excluded)")
        print(f"peak RSS of convert: {convert_rss / gb:.2f} GB; of importing its modules alone: "
              f"{import_rss / gb:.2f} GB; largest tensor: {largest / gb:.2f} GB")
        print(f"(peak - import) / largest tensor: {(convert_rss - import_rss) / largest:.2f}; "
              f"peak / checkpoint size: {convert_rss / total:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
