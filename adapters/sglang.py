"""SGLang-ready: the layout SGLang's ``LlamaForCausalLMEagle3`` loads, which is SpecForge's export."""

from .specforge import detect, read, write  # noqa: F401  (the same layout under SGLang's name)

NAME = "sglang"
