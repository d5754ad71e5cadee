"""A step that drafts nothing hands the speculator flat entries with the slots of vLLM's slot mapping for the step: the
same entries the general path (every row's slot table, :func:`draft_rows`) gives, for decodes and one-token prompt
chunks. (``tests/vllm/test_vllm_cache.py`` checks the same in a real engine, step by step.) A step whose rows all have
a grammar verifies chains only."""

from types import SimpleNamespace

import numpy as np
import torch

from eagle3_plugin.tree import DraftTree
from eagle3_plugin.vllm.step import Step, draft_entries, draft_rows


def test_a_decode_steps_entries_are_its_rows_entries():
    g = torch.Generator().manual_seed(0)
    b, block_size, blocks_per_row = 6, 16, 8
    base = torch.tensor([0, 15, 16, 40, 100, 127])  # first, last and next-to-a-boundary positions of blocks
    block_table = torch.randperm(b * blocks_per_row, generator=g).view(b, blocks_per_row).int()
    prefilling = torch.tensor([False, False, True, False, False, False])  # a one-token chunk that is not the last
    step = Step(req_ids=list("abcdef"), base=base, flat_start=torch.arange(b), count=torch.ones(b, dtype=torch.long),
                node_count=torch.ones(b, dtype=torch.long), prefilling=prefilling,
                tree=DraftTree.root_only(torch.zeros(b, dtype=torch.long)), tree_attention=None)
    step.sampled(torch.randint(3, 100, (b,), generator=g))
    token_ids = np.random.default_rng(0).integers(3, 100, (b, 256))
    runner = SimpleNamespace(input_ids=SimpleNamespace(cpu=torch.randint(3, 100, (b,), generator=g)),
                             input_batch=SimpleNamespace(token_ids_cpu=token_ids))
    features = torch.randn(b, 12, generator=g)
    slot_mapping = block_table[torch.arange(b), base // block_size].long() * block_size + base % block_size  # vLLM's

    fast = draft_entries(step, runner, features, block_table, block_size, slot_mapping)
    general = draft_rows(step, runner, features, block_table, block_size).entries()
    for name in ("slots", "positions", "tokens", "features"):
        assert torch.equal(getattr(fast, name), getattr(general, name)), name
    assert fast.tokens[2] == token_ids[2, base[2] + 1]  # the chunk's entry pairs with the next prompt token
    assert fast.slots[1] == block_table[1, 0] * block_size + 15 and fast.slots[2] == block_table[2, 1] * block_size


def test_a_step_verifies_chains_only_where_every_row_has_a_grammar():
    """vLLM verifies grammar rows along a chain: a step whose every row has one reads as verifying chains only."""
    def step(structured):
        b = 3
        return Step(req_ids=list("abc"), base=torch.zeros(b, dtype=torch.long), flat_start=torch.arange(b),
                    count=torch.ones(b, dtype=torch.long), node_count=torch.ones(b, dtype=torch.long),
                    prefilling=torch.zeros(b, dtype=torch.bool),
                    tree=DraftTree.root_only(torch.zeros(b, dtype=torch.long)), tree_attention=None,
                    structured=None if structured is None else torch.tensor(structured))
    assert step([True, True, True]).chains_only
    assert not step([True, False, True]).chains_only and not step(None).chains_only
