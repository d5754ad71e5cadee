"""Test-only SGLang general plugin: declare the platform fact ``has_amx`` so ``intel_amx`` is kept.

SGLang's EAGLE/EAGLE3 on CPU needs the ``intel_amx`` attention backend (draft_utils.py); on a CPU
without AMX tiles, ``arg_groups/overrides.py`` rewrites it to ``torch_native``, which supports neither
target-verify nor tree masks. The backend's kernels come from the plain-torch ``sgl_kernel`` stand-in
next to this package, so claiming the fact is safe here. It changes only ``get_platform().has_amx``;
``cpu_has_amx_support()`` (read by norms, activations, linear layers) stays false.

Loaded through the ``sglang.srt.plugins`` entry point declared by the ``*.dist-info`` folder beside
this package (found on PYTHONPATH), so it runs wherever SGLang calls ``load_plugins()``: the launcher
before server args are parsed, and every scheduler/detokenizer subprocess.
"""


def register() -> None:
    from sglang.srt.runtime_context import override_platform

    override_platform(has_amx=True).install()
