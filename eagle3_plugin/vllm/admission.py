"""Request admission with our worker: settings our sampler would not apply are refused before the engine sees them.

vLLM validates every request in its front end (``InputProcessor._validate_params``) and answers a
``VLLMValidationError`` with HTTP 400; the server keeps serving. A setting that reached the worker's step
unchecked would either be ignored (a wrong answer) or raise inside the engine core (every request dies), so
each one is either honoured by the worker or listed here.
"""

from __future__ import annotations

import contextvars

from .speculative import ADDITIONAL_CONFIG_KEY

# (SamplingParams attribute, the value that means "off", what the client calls it)
# Penalties, min_tokens, allowed_token_ids, bad words, logit_bias and min_p are honoured (:mod:`.output_rules`; a
# speculative vLLM of its own refuses the last two, ``SamplingParams._validate_spec_decode``), and so are logprobs and
# logprob_token_ids (the tree runner's ``_logprobs``).
UNSUPPORTED = (
    ("thinking_token_budget", None, "thinking_token_budget"),
    ("trace_decode_token_ids", None, "trace_decode_token_ids"),
)


def unsupported_settings(params) -> list[str]:
    """What in vLLM ``SamplingParams`` our worker would not apply."""
    return [name for attr, off, name in UNSUPPORTED if getattr(params, attr, off) not in (off, [], {})]


# Whether the request being validated is for an engine with our worker (vLLM's check of min_p and logit_bias sees
# only the speculative config, which is vLLM's own EAGLE-3 one in either case).
_validating_ours = contextvars.ContextVar("eagle3_validating_ours", default=False)


def install() -> None:
    """Wrap the front end's request validation: with our config, let ``min_p`` and ``logit_bias`` through and
    refuse what :func:`unsupported_settings` lists."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    original = InputProcessor._validate_params
    if getattr(original, "_eagle3_wrapped", False):
        return
    spec_decode_check = SamplingParams._validate_spec_decode

    def _validate_spec_decode(self, speculative_config):
        if not _validating_ours.get():
            spec_decode_check(self, speculative_config)

    def _validate_params(self, params, *args, **kwargs):
        ours = (self.vllm_config.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        validating = _validating_ours.set(bool(ours))
        try:
            result = original(self, params, *args, **kwargs)
        finally:
            _validating_ours.reset(validating)
        if ours and isinstance(params, SamplingParams):
            found = unsupported_settings(params)
            if found:
                raise VLLMValidationError(f"eagle3-plugin's speculative worker does not support {', '.join(found)}; "
                                          "send the request without them or serve without speculative decoding")
        return result

    _validate_params._eagle3_wrapped = True
    InputProcessor._validate_params = _validate_params
    SamplingParams._validate_spec_decode = _validate_spec_decode
