"""A bfloat16 SGLang server with our tree (fixed budget) on this CPU: greedy outputs equal SGLang's own bfloat16
server without speculation, and the tree accepts more than two drafts a round. Our draft and tree run in the target's
dtype, with SGLang's bfloat16 KV pools."""

from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from sglang_env import fixed_budget_config, our_tree_args, server

MAX_NEW_TOKENS = 48


def test_bfloat16_tree_equals_no_speculation(tmp_path):
    tok = AutoTokenizer.from_pretrained(TARGET)
    prompts = [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:8]]
    greedy = {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
    config = fixed_budget_config(DRAFT, str(tmp_path / "eagle3.json"))
    outputs = {}
    for name, args in (("plain", []), ("ours", our_tree_args(config))):
        with server(TARGET, ["--dtype", "bfloat16", *args], str(tmp_path / f"{name}.log")) as s:
            outputs[name] = [s.generate(p, greedy) for p in prompts]
    assert "dtype: torch.bfloat16" in (tmp_path / "ours.log").read_text()  # SGLang's KV pools: the server ran bf16
    assert [o["output_ids"] for o in outputs["ours"]] == [o["output_ids"] for o in outputs["plain"]]
    rounds = sum(o["meta_info"]["spec_verify_ct"] for o in outputs["ours"])
    assert len(prompts) * MAX_NEW_TOKENS > 3 * rounds  # more than two drafts accepted a round
