"""Our worker's draft tokens reach vLLM's scheduler with the step's output: the engine core never asks the worker
for them (one round trip a step saved when the worker has its own process), and the scheduler still schedules every
draft (greedy output and acceptance as vLLM's native chain, whose engine core does ask)."""

from transformers import AutoTokenizer

from bundled import DRAFT, HELDOUT, TARGET
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.datafiles import encode_prompt, read_prompts
from vllm_support import run_llm

DEPTH, MAX_TOKENS = 3, 24


def test_drafts_travel_with_the_output():
    tok = AutoTokenizer.from_pretrained(TARGET)
    prompts = [encode_prompt(tok, r.prompt) for r in read_prompts(HELDOUT)[:4]]
    common = dict(target=TARGET, prompts=prompts, temperature=0.0, max_tokens=MAX_TOKENS, count_draft_requests=True)
    ours = run_llm(dict(common, speculative_config=Eagle3Config.chain(DEPTH, draft=DRAFT, budget="fixed").to_dict()))
    native = run_llm(dict(common, speculative_config={"method": "eagle3", "model": DRAFT,
                                                      "num_speculative_tokens": DEPTH}))
    assert native["draft_requests"] > 0  # vLLM's own path asks after every step
    assert ours["draft_requests"] == 0
    assert ours["tokens"] == native["tokens"]
    for name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens"):
        assert ours["metrics"][name] == native["metrics"][name] > 0, name


def test_a_step_that_drafted_nothing_hands_nothing():
    """The scheduler cleared each scheduled request's draft tokens when it scheduled it: empty lists would change
    nothing, so none are sent (a loop over the batch saved each step under heavy load)."""
    from types import SimpleNamespace

    from eagle3_plugin.vllm import draft_handoff
    from vllm.v1.outputs import DraftTokenIds

    output = SimpleNamespace()
    draft_handoff.attach(output, DraftTokenIds(["a", "b"], [[], []]))
    assert getattr(output, draft_handoff.ATTRIBUTE) is None
    some = DraftTokenIds(["a", "b"], [[], [7, 8]])
    draft_handoff.attach(output, some)
    assert getattr(output, draft_handoff.ATTRIBUTE) is some
