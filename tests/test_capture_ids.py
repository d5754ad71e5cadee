import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from eagle3_plugin.capture import FusedCapture
from eagle3_plugin.capture_ids import LayerIdError, default_layer_ids, from_ours, to_ours, validate_layer_ids


@pytest.mark.parametrize("ids", [(0, 2, 5), (1, 3, 5), (2, 3, 4)])
def test_capture_matches_output_hidden_states(target, ids):
    ids_in = torch.randint(0, target.config.vocab_size, (2, 9))
    with torch.no_grad(), FusedCapture(target, ids) as capture:
        out = target(input_ids=ids_in, output_hidden_states=True)
    expected = torch.cat([out.hidden_states[i] for i in ids], dim=-1)
    assert capture.features.shape == (2, 9, 3 * target.config.hidden_size)
    torch.testing.assert_close(capture.features, expected, rtol=0, atol=0)


def test_capture_works_for_a_non_llama_decoder():
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=32, n_head=2, vocab_size=50)).eval()
    ids = torch.randint(0, 50, (1, 7))
    with torch.no_grad(), FusedCapture(model, (0, 1, 3)) as capture:
        out = model(input_ids=ids, output_hidden_states=True)
    torch.testing.assert_close(capture.features, torch.cat([out.hidden_states[i] for i in (0, 1, 3)], -1))


def test_capture_uses_one_buffer_and_detaches_hooks(target):
    capture = FusedCapture(target, (1, 3, 5), capacity_tokens=64)
    buffer = capture._buffer
    with torch.no_grad(), capture:
        target(input_ids=torch.zeros(1, 5, dtype=torch.long))
    assert capture.features.data_ptr() == buffer.data_ptr()
    before = capture.features.clone()
    with torch.no_grad():
        target(input_ids=torch.ones(1, 5, dtype=torch.long))  # outside the context: no hooks
    torch.testing.assert_close(capture.features, before)


def test_default_ids_are_distinct_for_every_depth():
    assert default_layer_ids(32) == (2, 16, 29)  # EAGLE's default where it works
    assert default_layer_ids(6) == (1, 3, 5)  # (2, 3, 3) would collide
    for n in range(3, 80):
        low, mid, high = default_layer_ids(n)
        assert 0 <= low < mid < high < n
    with pytest.raises(LayerIdError):
        default_layer_ids(2)


@pytest.mark.parametrize("ids, n, message", [
    ((1, 1, 3), 6, "distinct"), ((1, 3, 6), 6, "out of range"), ((3, 1, 4), 6, "increasing"),
    ((-1, 2, 3), 6, "out of range"), ((1, 2), 6, "three integers"),
])
def test_bad_layer_ids_are_refused(ids, n, message):
    with pytest.raises(LayerIdError, match=message):
        validate_layer_ids(ids, n)


def test_convention_mapping():
    assert to_ours((1, 15, 28), "sglang") == (2, 16, 29)
    assert from_ours((2, 16, 29), "sglang") == (1, 15, 28)
    assert to_ours((2, 16, 29), "vllm") == to_ours((2, 16, 29), "eagle") == (2, 16, 29)
    with pytest.raises(ValueError):
        to_ours((1, 2, 3), "tgi")
