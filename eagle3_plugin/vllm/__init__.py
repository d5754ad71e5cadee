"""vLLM integration: a ``vllm.general_plugins`` entry point, version-checked, over the core.

Loaded by vLLM in every process (API server, engine core, workers). Nothing here is imported by the core.
"""
