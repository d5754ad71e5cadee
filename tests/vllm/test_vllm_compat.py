"""The plugin's version and internals check: one clear error, naming everything that is missing."""

import pytest

from eagle3_plugin.vllm import compat


def test_installed_vllm_is_supported():
    assert compat.check_vllm() in compat.SUPPORTED_VERSIONS


def test_unknown_version_is_refused(monkeypatch):
    import vllm
    monkeypatch.setattr(vllm, "__version__", "0.99.0+cpu")
    with pytest.raises(compat.UnsupportedVllm, match=r"vLLM 0.99.0 is not supported \(supported: 0.32.0\)"):
        compat.check_vllm()


def test_missing_internal_is_named(monkeypatch):
    import vllm.v1.sample.rejection_sampler as rs
    monkeypatch.delattr(rs, "expand_kernel")
    with pytest.raises(compat.UnsupportedVllm, match="vllm.v1.sample.rejection_sampler.expand_kernel is missing"):
        compat.check_vllm()


def test_changed_signature_is_named(monkeypatch):
    import vllm.v1.sample.rejection_sampler as rs
    monkeypatch.setattr(rs, "expand_batch_to_tokens", lambda x, cu_num_tokens, num_tokens: None)
    with pytest.raises(compat.UnsupportedVllm, match="lacks parameter\\(s\\) replace_from, replace_to"):
        compat.check_vllm()


def test_expand_kernel_reference_semantics():
    import torch

    from eagle3_plugin.vllm.cpu_sampling import expand_kernel
    out = torch.full((6,), -1.0)
    expand_kernel(out, torch.tensor([0.0, 0.7, 1.3]), torch.tensor([2, 5, 6], dtype=torch.int32), 0.0, 1.0)
    assert out.tolist() == pytest.approx([1.0, 1.0, 0.7, 0.7, 0.7, 1.3])
