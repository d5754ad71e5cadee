"""Which vLLM versions we support, and a check of every vLLM internal the plugin touches.

An unsupported version, or a supported one whose internals differ from what we patch, gets one
:class:`UnsupportedVllm` error listing everything that is missing, never a silent fallback.
"""

from __future__ import annotations

import importlib
import inspect

SUPPORTED_VERSIONS = ("0.32.0",)

# (module, attribute path, parameter names the plugin relies on, or None for "exists")
REQUIRED_INTERNALS = (
    ("vllm.triton_utils.dispatcher", "register_kernels", ("overrides",)),
    ("vllm.platforms.cpu", "CpuPlatform.register_triton_kernel_overrides", ()),
    ("vllm.v1.sample.rejection_sampler", "expand_kernel", None),
    ("vllm.v1.sample.rejection_sampler", "expand_batch_to_tokens",
     ("x", "cu_num_tokens", "num_tokens", "replace_from", "replace_to")),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._setup_eagle3_aux_hidden_state_outputs", ()),
    ("vllm.model_executor.models.interfaces", "supports_eagle3", ("model",)),
    ("vllm.model_executor.models.interfaces", "SupportsEagle3.set_aux_hidden_state_layers", ("layers",)),
)


class UnsupportedVllm(RuntimeError):
    pass


def vllm_version() -> str:
    import vllm
    return vllm.__version__.split("+")[0]


def check_vllm() -> str:
    """Return the vLLM version after checking it and every internal in :data:`REQUIRED_INTERNALS`."""
    version = vllm_version()
    problems = []
    if version not in SUPPORTED_VERSIONS:
        problems.append(f"vLLM {version} is not supported (supported: {', '.join(SUPPORTED_VERSIONS)})")
    for module_name, path, params in REQUIRED_INTERNALS:
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
    if problems:
        raise UnsupportedVllm("eagle3-plugin cannot run on this vLLM: " + "; ".join(problems))
    return version
