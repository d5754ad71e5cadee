"""KV-cache slot copy of sgl-kernel's CPU build, in plain torch (buffers are given by raw data pointers)."""

import ctypes

import torch

from ._registry import op


@op("copy_all_layer_kv_cache_cpu(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()")
def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every buffer i (data_ptrs[i] = base address, strides[i] = bytes per slot row) copy row
    src_loc[j] to row tgt_loc[j], all j, reading every source row before writing any target row."""
    if tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.long(), src_loc.long()
    rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.view(torch.int64).tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(ptr)
        buf = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)
        buf[tgt] = buf[src].clone()
