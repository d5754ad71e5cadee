"""Our eagle3.json as vLLM's speculative_config (checked, passed on as ours; the plugin turns it into vLLM's
settings plus additional_config), and the server launcher's argument rewriting."""

import json
import shutil

import pytest

from bundled import DRAFT, TARGET
from eagle3_plugin.errors import Eagle3Error
from eagle3_plugin.vllm.speculative import engine_settings, speculative_config


@pytest.fixture
def chain_file(tmp_path):
    path = tmp_path / "eagle3.json"
    path.write_text(json.dumps({"draft": DRAFT, "mode": "chain", "depth": 4, "layer_ids": [1, 3, 5]}))
    return str(path)


def test_file_inline_and_passthrough(chain_file):
    ours = speculative_config(chain_file)
    assert ours["mode"] == "chain" and ours["depth"] == 4 and ours["total_tokens"] == 5 and ours["draft"] == DRAFT
    assert speculative_config(json.dumps({"draft": DRAFT, "mode": "chain", "depth": 4, "layer_ids": [1, 3, 5]})) == ours
    native = {"method": "eagle3", "model": "x", "num_speculative_tokens": 2}
    assert speculative_config(json.dumps(native)) == native


def test_engine_settings_reserve_one_draft_slot_per_tree_node():
    vllm, extra = engine_settings(speculative_config(DRAFT))  # the bundled eagle3.json: a 32-token tree
    assert vllm == {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 31}
    assert extra["eagle3"]["mode"] == "tree" and extra["eagle3"]["draft"] == DRAFT


def test_bad_values_are_refused():
    with pytest.raises(Eagle3Error, match="unknown key 'dpeth'"):
        speculative_config(json.dumps({"mode": "chain", "dpeth": 3}))
    with pytest.raises(Eagle3Error, match="neither a file nor JSON"):
        speculative_config("no/such/eagle3.json")


def test_layer_ids_must_agree_with_what_vllm_reads(tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(DRAFT, draft)
    with pytest.raises(Eagle3Error, match=r"differs from eagle3.json's layer_ids \[0, 2, 4\]"):
        speculative_config(json.dumps({"draft": str(draft), "mode": "chain", "depth": 3, "layer_ids": [0, 2, 4]}))


def test_vllm_cli_reads_our_file_and_passes_json_through(chain_file):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    ours = parser.parse_args(["--speculative-config", chain_file]).speculative_config
    assert ours["mode"] == "chain" and ours["draft"] == DRAFT
    native = {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 2}
    assert parser.parse_args(["-sc", json.dumps(native)]).speculative_config == native
    inline = parser.parse_args(["--speculative-config", json.dumps({"mode": "chain", "depth": 2})])
    assert inline.speculative_config == {"mode": "chain", "depth": 2}


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_a_quantized_kv_cache_is_refused_with_one_message(kv_cache_dtype):
    """Our tree attention and draft read the cache as the model's dtype (an fp8 cache took the engine down at its first
    tree step)."""
    from vllm.engine.arg_utils import EngineArgs
    args = EngineArgs(model=TARGET, speculative_config={"draft": DRAFT, "mode": "chain", "depth": 3},
                      kv_cache_dtype=kv_cache_dtype)
    with pytest.raises(Eagle3Error, match=f"kv_cache_dtype 'auto', got '{kv_cache_dtype}'"):
        args.create_engine_config()


@pytest.mark.parametrize("parallel", [dict(pipeline_parallel_size=2), dict(data_parallel_size=2)])
def test_pipeline_and_data_parallel_engines_are_refused_with_one_message(parallel):
    from vllm.engine.arg_utils import EngineArgs
    args = EngineArgs(model=TARGET, speculative_config={"draft": DRAFT, "mode": "chain", "depth": 3}, **parallel)
    with pytest.raises(Eagle3Error, match="pipeline and data parallel size 1"):
        args.create_engine_config()


def test_a_path_in_engine_args_is_read_as_on_the_command_line(chain_file):
    """``LLM(speculative_config="eagle3.json")`` (vLLM itself takes only a dict there) gets our config; a string that is
    neither a file nor JSON gets our error, not vLLM's ``AttributeError``."""
    from vllm.engine.arg_utils import EngineArgs
    config = EngineArgs(model=TARGET, dtype="float32", speculative_config=chain_file).create_engine_config()
    assert config.speculative_config.num_speculative_tokens == 4
    assert config.additional_config["eagle3"]["mode"] == "chain"
    with pytest.raises(Eagle3Error, match="neither a file nor JSON"):
        EngineArgs(model=TARGET, speculative_config="no/such/eagle3.json").create_engine_config()
