"""A target SGLang cannot feed an EAGLE-3 draft from (Glm4: no ``set_eagle3_layers_to_capture``) runs our tree
through our capture in the real server: greedy outputs equal SGLang without speculation, and acceptance equals
the reference generator's (which captures from transformers' hidden states), round for round."""

import subprocess

from transformers import AutoTokenizer

from bundled import HELDOUT
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from eagle3_plugin.reference import AcceptanceStats, SpeculativeGenerator
from eagle3_plugin.sampler import SamplingParams
from sglang_env import SGLANG_PYTHON, fixed_budget_config, server, server_env

MAX_TOKENS = 32
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "12"]


def test_stock_sglang_has_no_eagle3_capture_for_glm4():
    code = ("from sglang.srt.models.glm4 import Glm4ForCausalLM\n"
            "print(hasattr(Glm4ForCausalLM, 'set_eagle3_layers_to_capture'))")
    proc = subprocess.run([SGLANG_PYTHON, "-c", code], capture_output=True, text=True, timeout=300, env=server_env())
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stderr[-2000:]


def test_glm4_target_through_our_capture_matches_the_reference(glm4, tmp_path):
    target, draft = glm4
    tok = AutoTokenizer.from_pretrained(target)
    prompts = [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:6]]
    params = {"max_new_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    with server(target, [], str(tmp_path / "plain.log")) as plain:
        expected = [plain.generate(p, params)["output_ids"] for p in prompts]
    fixed = fixed_budget_config(draft, str(tmp_path / "eagle3.json"))  # acceptance compares round for round
    args = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", fixed, *TREE]
    with server(target, args, str(tmp_path / "ours.log")) as ours:
        outs = [ours.generate(p, params) for p in prompts]
    assert [o["output_ids"] for o in outs] == expected

    config = Eagle3Config(draft=draft, layer_ids=(1, 3, 5), mode="tree", depth=3, top_k=4, total_tokens=12)
    gen = SpeculativeGenerator.from_pretrained(target, config)
    stats = AcceptanceStats(config.depth)
    for prompt in prompts:
        stats.merge(gen.generate([prompt], MAX_TOKENS, SamplingParams.uniform(1)).stats)
    rounds = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    accepted = sum(o["meta_info"]["spec_num_correct_drafts"] for o in outs)
    assert (rounds, accepted) == (stats.rounds, stats.accepted_tokens)
    assert stats.accepted_tokens > 20  # the draft is accepted often enough for the comparison to mean something
