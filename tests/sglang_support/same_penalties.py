"""Run on SGLang's interpreter: our per-node rules (the SGLang shim's reading of requests, the core's SGLang
arithmetic, logit_bias last) equal SGLang's own penalizers bit for bit, each node's context fed to them one token
at a time and summed as ``SamplingBatchInfo.update_penalties`` sums them. Prints "same"."""
import os
import sys
import types

import torch
from sglang.srt.sampling.penaltylib import (BatchedFrequencyPenalizer, BatchedMinNewTokensPenalizer,
                                            BatchedPenalizerOrchestrator, BatchedPresencePenalizer,
                                            BatchedRepetitionPenalizer)
from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties
from sglang.srt.sampling.sampling_params import SamplingParams
from eagle3_plugin.sglang.output_rules import output_rules

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from random_trees import random_trees  # noqa: E402

V, N, B = 50, 10, 4
PENALIZERS = {BatchedFrequencyPenalizer, BatchedMinNewTokensPenalizer, BatchedPresencePenalizer,
              BatchedRepetitionPenalizer}


class Batch:  # what the orchestrator and our shim read of a ScheduleBatch
    def __init__(self, reqs, logit_bias=None):
        self.reqs, self.device = reqs, "cpu"
        self.sampling_info = types.SimpleNamespace(acc_additive_penalties=torch.zeros(len(reqs), V),
                                                   logit_bias=logit_bias)


def request(output, **params):
    tokenizer = types.SimpleNamespace(eos_token_id=1, additional_stop_token_ids={2})
    return types.SimpleNamespace(sampling_params=SamplingParams(**params), eos_token_ids={3}, tokenizer=tokenizer,
                                 output_ids=list(output))


def sglang_logits(req, context, x, bias):
    orchestrator = BatchedPenalizerOrchestrator(V, Batch([req]), PENALIZERS)
    for token in context:
        orchestrator.cumulate_output_tokens(torch.tensor([token]))
    additive = torch.zeros(1, V)
    orchestrator.accumulate_additive_penalties(additive)
    x = x[None].clone()
    x.add_(additive)
    scaling = orchestrator.accumulate_scaling_penalties()
    if scaling is not None:
        apply_scaling_penalties(x, scaling)
    x.add_(bias)  # SamplingBatchInfo._apply_post_grammar_logits_transforms
    return x[0]


gen = torch.Generator().manual_seed(0)
tree = random_trees(B, N, 8, gen)
reqs = [request([5, 5, 6, 5, 7, 5, 5], frequency_penalty=0.3, presence_penalty=0.5, repetition_penalty=1.2),
        request([4, 6, 4], min_new_tokens=6, stop_token_ids=[4], repetition_penalty=0.9),
        request([], frequency_penalty=0.1),
        request([6, 6, 6, 6, 6, 6], presence_penalty=-0.4, min_new_tokens=2)]
for row, req in enumerate(reqs):
    tree.tokens[row, 0] = req.output_ids[-1] if req.output_ids else 0
logits = torch.randn(B, N, V, generator=gen) * 3
bias = torch.zeros(B, V)
bias[1, :20] = torch.randn(20, generator=gen) * 4  # one request with a logit_bias
ours = output_rules(Batch(reqs, bias), V).apply(tree, logits.clone())
for row, req in enumerate(reqs):
    for node in range(N):
        path, at = [], node
        while at > 0:
            path.append(int(tree.tokens[row, at]))
            at = int(tree.parents[row, at])
        context = req.output_ids + path[::-1]
        theirs = sglang_logits(req, context, logits[row, node], bias[row])
        assert torch.equal(ours[row, node], theirs), (row, node, (ours[row, node] - theirs).abs().max())
print("same")
