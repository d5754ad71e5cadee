"""Our ``eagle3.json`` in vLLM: ``speculative_config`` for ``LLM(...)``, the launcher, and the engine-args hook.

vLLM keeps its own speculative-config schema; our settings travel in ``additional_config["eagle3"]``, the
field vLLM reserves for plugins, which reaches every worker. With the plugin loaded, ``LLM(...,
speculative_config=<our dict>)`` works directly: :func:`install` translates it when vLLM builds its
config, and so does a path to our ``eagle3.json`` (or a JSON string), as ``--speculative-config`` takes. vLLM's own
dict (with ``method``) passes through untouched and runs vLLM's native EAGLE-3 chain.
"""

from __future__ import annotations

import json
import os

from ..config import Eagle3Config
from ..errors import Eagle3Error

OUR_KEYS = {"mode", "depth", "top_k", "total_tokens", "tree_sampler", "budget", "layer_ids", "draft"}
ADDITIONAL_CONFIG_KEY = "eagle3"


def speculative_config(value) -> dict:
    """``value``: a path to ``eagle3.json`` (or its folder), our config as a dict / JSON string, or vLLM's
    own speculative-config dict / JSON. Returns vLLM's dict unchanged, or our config, checked, as a dict
    with an absolute draft path."""
    if isinstance(value, str) and os.path.exists(value):
        return _checked(Eagle3Config.load(value)).to_dict()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise Eagle3Error(f"--speculative-config: {value!r} is neither a file nor JSON") from None
    if not isinstance(value, dict):
        raise Eagle3Error("--speculative-config must be a path to eagle3.json or a JSON object")
    if not is_ours(value):
        return value
    config = Eagle3Config.from_dict(value, source="--speculative-config")
    return _checked(config).to_dict() | {"draft": os.path.abspath(config.draft)}


def is_ours(value: dict) -> bool:
    return "method" not in value and bool(set(value) & OUR_KEYS)


def engine_settings(ours: dict) -> tuple[dict, dict]:
    """Our config dict -> (vLLM's speculative_config, ``additional_config`` entries). vLLM drafts nothing
    itself: it loads the draft to run its start-up checks and reserves ``total_tokens - 1`` draft slots per
    request, which our tree worker fills."""
    config = _checked(Eagle3Config.from_dict(ours, source="speculative_config"))
    vllm = {"method": "eagle3", "model": os.path.abspath(config.draft),
            "num_speculative_tokens": config.total_tokens - 1}
    return vllm, {ADDITIONAL_CONFIG_KEY: config.to_dict() | {"draft": vllm["model"]}}


CLI_SWITCH = "EAGLE3_VLLM_CLI"  # "0": --speculative-config is vLLM's alone (JSON), as without the plugin


def speculative_config_type(vllm_type):
    """``--speculative-config``'s argument type with the plugin: a path to an existing ``.json`` file is our
    config (checked; ``draft`` relative to the file's folder); anything else goes to vLLM's ``json.loads``."""
    def parse(value: str):
        if value.endswith(".json") and os.path.isfile(value):
            try:
                return speculative_config(value)
            except Eagle3Error as e:
                raise ValueError(str(e)) from None  # argparse names the argument and exits 2
        return vllm_type(value)

    parse.eagle3 = True
    parse.__name__ = "speculative_config"
    return parse


def install() -> None:
    """Translate our config when vLLM builds its engine config (in the process that parses arguments), and read
    ``--speculative-config PATH.json`` on vLLM's command line. vLLM's server CLI loads general plugins before it
    adds the engine's arguments (``AsyncEngineArgs.add_cli_args``), so wrapping ``EngineArgs.add_cli_args``
    here reaches ``vllm serve``."""
    from vllm.engine.arg_utils import EngineArgs

    original_cli = EngineArgs.add_cli_args
    if os.environ.get(CLI_SWITCH, "1") != "0" and not getattr(original_cli, "_eagle3_wrapped", False):
        def add_cli_args(parser, *args, **kwargs):
            parser = original_cli(parser, *args, **kwargs)
            action = parser._option_string_actions["--speculative-config"]
            if not getattr(action.type, "eagle3", False):
                action.type = speculative_config_type(action.type)
            return parser

        add_cli_args._eagle3_wrapped = True
        EngineArgs.add_cli_args = staticmethod(add_cli_args)

    original = EngineArgs.create_engine_config
    if getattr(original, "_eagle3_wrapped", False):
        return

    def create_engine_config(self, *args, **kwargs):
        if isinstance(self.speculative_config, str):  # LLM(speculative_config="eagle3.json"), as on the command line
            self.speculative_config = speculative_config(self.speculative_config)
        if isinstance(self.speculative_config, dict) and is_ours(self.speculative_config):
            sizes = (self.pipeline_parallel_size, self.data_parallel_size)
            if sizes != (1, 1):
                raise Eagle3Error(
                    f"eagle3-plugin's worker runs with pipeline and data parallel size 1 (got {sizes}; tensor "
                    "parallelism is supported): serve with those, or with vLLM's native EAGLE-3 chain (method: "
                    "eagle3)")
            if self.kv_cache_dtype != "auto":  # its tree attention and draft read the cache as the model's dtype
                raise Eagle3Error(
                    f"eagle3-plugin's worker keeps the KV cache in the model's dtype (kv_cache_dtype 'auto', got "
                    f"{self.kv_cache_dtype!r}): serve with that, or with vLLM's native EAGLE-3 chain (method: eagle3)")
            self.speculative_config, extra = engine_settings(self.speculative_config)
            self.additional_config = {**(self.additional_config or {}), **extra}
        return original(self, *args, **kwargs)

    create_engine_config._eagle3_wrapped = True
    EngineArgs.create_engine_config = create_engine_config


def _checked(config: Eagle3Config) -> Eagle3Config:
    """vLLM reads capture ids from the draft's config.json: they must agree with eagle3.json's."""
    path = os.path.join(config.draft, "config.json")
    try:
        with open(path) as f:
            in_draft = json.load(f).get("eagle_aux_hidden_state_layer_ids")
    except (OSError, json.JSONDecodeError) as e:
        raise Eagle3Error(f"{path}: cannot read the draft config ({e})") from None
    if config.layer_ids is not None and (in_draft is None or tuple(in_draft) != tuple(config.layer_ids)):
        raise Eagle3Error(f"{path}: eagle_aux_hidden_state_layer_ids {in_draft} differs from eagle3.json's "
                          f"layer_ids {list(config.layer_ids)} (vLLM reads config.json)")
    return config
