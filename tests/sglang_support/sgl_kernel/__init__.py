"""Test-only stand-in for sgl-kernel's CPU build (tests/sglang_support/README.md).

SGLang 0.5.23 on ``--device cpu`` (SGLANG_USE_CPU_ENGINE=1) imports ``sgl_kernel`` and calls, for a
Llama target with an EAGLE-3 draft, the twelve CPU kernels below. The PyPI ``sglang-kernel`` wheel has
CUDA code only, so they are reimplemented here in plain torch and registered both as module functions
and as ``torch.ops.sgl_kernel.<name>``. Kernels SGLang uses only with AMX (``convert_weight_packed``,
``rmsnorm_cpu``, ...) are deliberately absent: their absence keeps ``cpu_has_amx_support()`` false, so
norms, activations, rotary embedding and linear layers take SGLang's native torch paths.
No other name is needed for this path: the CPU modules import only these twelve from ``sgl_kernel``,
and the other model files that fail to import are skipped by SGLang's model registry.
"""

from .attention import decode_attention_cpu, extend_attention_cpu
from .kvcache import copy_all_layer_kv_cache_cpu
from .speculative import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu", "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu", "build_tree_kernel_efficient_cpu", "copy_all_layer_kv_cache_cpu",
    "decode_attention_cpu", "extend_attention_cpu", "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu", "verify_tree_greedy_cpu",
]
__version__ = "0.0.0+eagle3-test-stand-in"
