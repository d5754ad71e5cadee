"""The packed draft (drafting's forward: fused projections, a table of normalised embeddings, no module calls) gives
exactly the numbers of the draft module (the separate official layers, the norm computed per token)."""

import pytest
import torch
import torch.nn.functional as F

from conftest import random_draft, tiny_llama
from eagle3_plugin.draft import ConcatAttention, grouped_mask, masked_attention
from eagle3_plugin.packed_draft import PackedDraft


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_draft_equals_the_module(dtype):
    target = tiny_llama()
    draft = random_draft(target)
    draft.to(dtype).attach_embedding(torch.nn.Embedding.from_pretrained(target.get_input_embeddings().weight.to(dtype)))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.config.vocab_size, (3, 9), generator=g)
    features = torch.randn(3, 9, draft.fc.in_features, generator=g).to(dtype)
    positions = torch.arange(4, 13).expand(3, -1)
    queries = torch.tensor([[8], [3], [0]])
    for weights in range(3):  # the module's own weights, then two others (packed anew)
        if weights:
            with torch.no_grad():
                for p in draft.parameters():
                    p.add_(0.1 * torch.randn(p.shape, generator=g).to(dtype))
        packed = PackedDraft.of(draft)
        with torch.no_grad():
            hidden = draft.fuse(features)
            assert torch.equal(packed.fuse(features), hidden)
            for q in (None, queries):
                attention = lambda: ConcatAttention(scale=draft.attention_scale)  # noqa: E731
                out = draft(ids, hidden, positions, attention(), q)
                assert torch.equal(packed.forward(ids, hidden, positions, attention(), q), out)
                assert torch.equal(packed.logits(out), draft.logits(out))
            for a, b in zip(packed.keys_values(ids, hidden, positions), draft.keys_values(ids, hidden, positions)):
                assert torch.equal(a, b)
        assert torch.equal(packed.hot_ids, draft.hot_token_ids)


def test_masked_attention_reads_any_layout_of_the_kernel_output(monkeypatch):
    """CUDA's fused attention kernels return their output stored ``[B, Q, H, D]`` (an H200 run found ``view`` failing
    on it): the draft's grouped-query attention takes any layout, and is plain softmax attention either way."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, heads, n, 8, generator=g) for heads, n in ((4, 3), (2, 5), (2, 5)))
    allowed = torch.rand(2, 3, 5, generator=g) > 0.4
    allowed[..., 0] = True
    scores = q.double() @ k.double().repeat_interleave(2, dim=1).transpose(2, 3) * 0.35
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    expected = torch.softmax(scores, -1) @ v.double().repeat_interleave(2, dim=1)
    kernel = F.scaled_dot_product_attention
    for layout in (kernel, lambda *a, **kw: kernel(*a, **kw).transpose(1, 2).contiguous().transpose(1, 2)):
        monkeypatch.setattr(F, "scaled_dot_product_attention", layout)
        out = masked_attention(q, k, v, grouped_mask(allowed, 2, torch.float32), 0.35)
        torch.testing.assert_close(out, expected.float())  # float32's tolerance: kernels round differently by ISA
