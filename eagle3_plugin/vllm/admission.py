"""Request admission with our worker: settings our sampler would not apply are refused before the engine sees them.

vLLM validates every request in its front end (``InputProcessor._validate_params``) and answers a
``VLLMValidationError`` with HTTP 400; the server keeps serving. A setting that reached the worker's step
unchecked would either be ignored (a wrong answer) or raise inside the engine core (every request dies), so
each one is either honoured by the worker or listed here.
"""

from __future__ import annotations

from .speculative import ADDITIONAL_CONFIG_KEY

# (SamplingParams attribute, the value that means "off", what the client calls it)
# Penalties, min_tokens, allowed_token_ids and bad words are honoured (:mod:`.output_rules`). min_p and logit_bias
# are not: vLLM builds no logits processor for them in a speculative engine, so steps its sampler decides would drop
# them too (vLLM's own drafters ignore them, with a warning at start-up).
UNSUPPORTED = (
    ("min_p", 0.0, "min_p"),
    ("logit_bias", None, "logit_bias"),
    ("logprob_token_ids", None, "logprob_token_ids"),
    ("thinking_token_budget", None, "thinking_token_budget"),
    ("trace_decode_token_ids", None, "trace_decode_token_ids"),
)


def unsupported_settings(params, tree: bool) -> list[str]:
    """What in vLLM ``SamplingParams`` our worker would not apply (``tree``: top_k > 1 in our config)."""
    found = [name for attr, off, name in UNSUPPORTED if getattr(params, attr, off) not in (off, [], {})]
    if tree and getattr(params, "structured_outputs", None) is not None:
        found.append("structured output with a draft tree (vLLM's grammar masks drafts as a chain; serve a chain)")
    return found


def install() -> None:
    """Wrap the front end's request validation: with our config, refuse what :func:`unsupported_settings` lists."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    original = InputProcessor._validate_params
    if getattr(original, "_eagle3_wrapped", False):
        return

    def _validate_params(self, params, *args, **kwargs):
        result = original(self, params, *args, **kwargs)
        ours = (self.vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if ours and isinstance(params, SamplingParams):
            found = unsupported_settings(params, tree=ours["top_k"] > 1)
            if found:
                raise VLLMValidationError(f"eagle3-plugin's speculative worker does not support {', '.join(found)}; "
                                          "send the request without them or serve without speculative decoding")
        return result

    _validate_params._eagle3_wrapped = True
    InputProcessor._validate_params = _validate_params
