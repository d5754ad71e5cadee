"""A bfloat16 engine with our tree. vLLM's CPU backend lays bfloat16 caches out for its ``amx`` kernels on CPUs with
AMX, a layout our tree attention does not read; an engine with our worker runs the backend's ``vec`` kernels instead
(``eagle3_plugin/vllm/tree_attention.py``), and serves: greedy outputs equal no speculation's on the same kernels.
(On a CPU without AMX both engines pick ``vec`` themselves.)"""

import torch
from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from vllm_support import run_llm


def test_bfloat16_tree_runs_the_vec_kernels_and_equals_no_speculation():
    tok = AutoTokenizer.from_pretrained(TARGET)
    prompts = [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:8]]
    common = dict(target=TARGET, prompts=prompts, temperature=0.0, max_tokens=48, engine={"dtype": "bfloat16"},
                  attention_isas=True)
    ours = run_llm(dict(common, speculative_config=Eagle3Config.load(DRAFT).to_dict()))
    plain = run_llm(dict(common, attention_isa="vec"), plugins="")
    assert ours["attention_isas"] == plain["attention_isas"] == ["vec"]
    assert ours["metrics"]["vllm:spec_decode_num_accepted_tokens"] > 2 * ours["metrics"]["vllm:spec_decode_num_drafts"]
    assert ours["tokens"] == plain["tokens"]


def test_without_our_worker_vllm_keeps_its_own_choice():
    """The layout is changed only in engines that run our worker: vLLM's native chain keeps ``amx`` where vLLM picks
    it."""
    tok = AutoTokenizer.from_pretrained(TARGET)
    prompts = [encode_prompt(tok, read_prompts(HELDOUT)[0].prompt)]
    native = run_llm(dict(target=TARGET, draft=DRAFT, prompts=prompts, temperature=0.0, max_tokens=8,
                          engine={"dtype": "bfloat16"}, attention_isas=True))
    assert native["attention_isas"] == (["amx"] if torch.cpu._is_amx_tile_supported() else ["vec"])
