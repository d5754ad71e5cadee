"""The draft's inference path (one fused projection, a table of normalised embeddings) gives exactly the numbers of
its training path (the separate official layers, the norm computed per token), and follows weight changes."""

import torch

from conftest import random_draft, tiny_llama


def outputs(draft, ids, hidden, positions):
    """Forward outputs and keys/values, by the inference path (no grad) and the training path (grad on)."""
    with torch.no_grad():
        fast = (draft(ids, hidden, positions), *draft.keys_values(ids, hidden, positions))
    with torch.enable_grad():
        plain = (draft(ids, hidden, positions), *draft.keys_values(ids, hidden, positions))
    return fast, [t.detach() for t in plain]


def test_inference_path_equals_training_path_and_follows_weight_changes():
    target = tiny_llama()
    draft = random_draft(target)
    draft.attach_embedding(target.get_input_embeddings())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.config.vocab_size, (3, 9), generator=g)
    hidden = torch.randn(3, 9, draft.config.hidden_size, generator=g)
    positions = torch.arange(4, 13).expand(3, -1)
    for change in (None, "midlayer.self_attn.k_proj.weight", "midlayer.input_layernorm.weight",
                   "midlayer.mlp.up_proj.weight"):
        if change is not None:
            with torch.no_grad():
                draft.get_parameter(change).mul_(1.5)
        fast, plain = outputs(draft, ids, hidden, positions)
        for a, b in zip(fast, plain):
            assert torch.equal(a, b), change
    with torch.no_grad():  # the shared embedding changes too
        target.get_input_embeddings().weight.mul_(0.5)
    fast, plain = outputs(draft, ids, hidden, positions)
    assert all(torch.equal(a, b) for a, b in zip(fast, plain))
