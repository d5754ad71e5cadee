"""SGLang integration: ``python -m sglang.launch_server ... --speculative-algorithm EAGLE3`` with our draft tree,
strict sampler and fused capture (entry point ``sglang.srt.plugins``: :func:`.plugin.register`)."""
