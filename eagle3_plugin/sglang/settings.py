"""Our settings inside SGLang: server arguments, the worker's :class:`Eagle3Config`, request admission.

``--speculative-draft-model-path`` may name a draft folder in any format we read (SGLang/SpecForge, ours,
speculators, EAGLE) or our ``eagle3.json``. When the draft folder holds an ``eagle3.json`` (or the path is
one) and no tree flag is given, its tree shape fills ``--speculative-num-steps`` (= our depth),
``--speculative-eagle-topk`` and ``--speculative-num-draft-tokens`` (= our total_tokens); explicit flags win.
The file's other settings (``tree_sampler``, ``budget``, ``layer_ids``) reach the scheduler processes through the
environment variable :data:`CONFIG_ENV`, set in the launcher before they start. SGLang's radix cache stays on:
the draft's keys and values live in SGLang's draft pool at the same slots as the target's, and SGLang keys its
EAGLE radix tree by token pairs, so a cached prefix brings exact draft entries.
"""

from __future__ import annotations

import os

from ..capture_ids import to_ours
from ..config import CONFIG_FILENAME, Eagle3Config


ALGORITHM = "EAGLE3"
CONFIG_ENV = "EAGLE3_PLUGIN_SGLANG_CONFIG"


def is_ours(algorithm: str | None) -> bool:
    return (algorithm or "").upper() == ALGORITHM


def our_config_file(draft_path: str | None) -> str | None:
    """The ``eagle3.json`` that ``--speculative-draft-model-path`` names or holds, if any."""
    if not draft_path:
        return None
    if os.path.isfile(draft_path):
        return draft_path
    candidate = os.path.join(draft_path, CONFIG_FILENAME)
    return candidate if os.path.isfile(candidate) else None


def resolve_server_args(server_args) -> None:
    """BEFORE SGLang's ``handle_speculative_decoding``: apply our ``eagle3.json``."""
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.arg_groups.overrides import declare_resolution

    cfg = resolving_view(server_args)
    if not is_ours(cfg.speculative_algorithm):
        return
    fields = {}
    config_file = our_config_file(cfg.speculative_draft_model_path)
    if config_file is not None:
        ours = Eagle3Config.load(config_file)
        os.environ[CONFIG_ENV] = os.path.abspath(config_file)
        if os.path.isfile(cfg.speculative_draft_model_path):
            fields["speculative_draft_model_path"] = ours.draft
        flags = (cfg.speculative_num_steps, cfg.speculative_eagle_topk, cfg.speculative_num_draft_tokens)
        if all(flag is None for flag in flags):
            fields.update(speculative_num_steps=ours.depth, speculative_eagle_topk=ours.top_k,
                          speculative_num_draft_tokens=ours.total_tokens)
    if fields:
        declare_resolution(server_args, "eagle3-plugin", **fields)


def worker_config(draft_path: str, num_steps: int, topk: int, num_draft_tokens: int) -> Eagle3Config:
    """The tree SGLang was started with, as our config; ``tree_sampler``, ``budget`` and ``layer_ids`` from the
    launcher's ``eagle3.json`` (:data:`CONFIG_ENV`) or the draft folder's, if any (``layer_ids`` None: the draft's
    own; ``budget`` by default auto)."""
    config_file = os.environ.get(CONFIG_ENV) or our_config_file(draft_path)
    given = Eagle3Config.load(config_file) if config_file else Eagle3Config()
    kw = dict(draft=draft_path, layer_ids=given.layer_ids, tree_sampler=given.tree_sampler, budget=given.budget)
    if topk == 1:
        return Eagle3Config.chain(num_steps, **kw)
    return Eagle3Config(mode="tree", depth=num_steps, top_k=topk, total_tokens=num_draft_tokens, **kw)


def sglang_default_layer_ids(num_layers: int) -> tuple[int, ...]:
    """What stock SGLang captures for a draft that records no ids (``llama.py``: 2, n//2, n-3), in our rule."""
    return to_ours((2, num_layers // 2, num_layers - 3), "sglang")


UNSUPPORTED_SETTINGS = (
    # (sampling_params key, value that means "off", what it is)
    ("watermark", None, "watermark"),
)


def unsupported_request_settings(sampling_params: dict | None, custom_logit_processor) -> list[str]:
    """Sampling settings our verifier does not apply (it must refuse them rather than ignore them)."""
    params = sampling_params or {}
    found = [name for key, off, name in UNSUPPORTED_SETTINGS if params.get(key) not in (None, off)]
    if custom_logit_processor:
        found.append("custom_logit_processor")
    return found


def out_of_range(obj, input_ids, vocab_size: int) -> str | None:
    """What SGLang 0.5.23 admits but its scheduler then raises on, taking the whole server down: token ids outside
    the vocabulary in the prompt (the target's embedding lookup) or among the stop ids (its ``min_new_tokens``
    penalizer's scatter), and more top logprobs than the vocabulary has (its sampler's top-k). None when the request
    has none of them."""
    stop_ids = (obj.sampling_params or {}).get("stop_token_ids")
    for what, ids in (("prompt token ids", input_ids), ("stop_token_ids", stop_ids)):
        if ids and not (0 <= min(ids) and max(ids) < vocab_size):  # min and max: a long prompt in C
            outside = [t for t in ids if not 0 <= t < vocab_size][:5]
            return f"{what} must lie in [0, {vocab_size}); got {outside}"
    if obj.return_logprob and obj.top_logprobs_num > vocab_size:
        return f"top_logprobs_num must be at most the vocabulary size, {vocab_size}; got {obj.top_logprobs_num}"
    return None


def validate_request(result, self, obj, input_ids):
    """AFTER SGLang's ``TokenizerManager._validate_one_request``: refuse what our verifier would ignore, and what
    would stop the server (:func:`out_of_range`)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    if is_ours(self.server_args.speculative_algorithm) and isinstance(obj, GenerateReqInput):
        found = unsupported_request_settings(obj.sampling_params, obj.custom_logit_processor)
        if found:
            raise ValueError(f"eagle3-plugin's EAGLE3 worker does not support {', '.join(found)}; "
                             "send the request without them or serve without speculative decoding")
        problem = out_of_range(obj, input_ids, self.model_config.vocab_size)
        if problem:
            raise ValueError(problem)
    return result
