"""Bad checkpoints and configs: one clear Eagle3Error each, and nothing half-written."""

import json
import os
import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_plugin.checkpoint import load_draft, save_draft, validate_against_target
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.errors import Eagle3Error


@pytest.fixture
def saved(tmp_path, draft):
    out = tmp_path / "draft"
    save_draft(draft, str(out), Eagle3Config(layer_ids=(1, 3, 5)))
    return out


def rewrite(folder, change):
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def test_round_trip_is_exact(saved, draft):
    loaded = load_draft(str(saved))
    for name, value in draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    assert Eagle3Config.load(str(saved)).layer_ids == (1, 3, 5)


def test_missing_folder_and_weights(tmp_path, saved):
    with pytest.raises(Eagle3Error, match="no such draft folder"):
        load_draft(str(tmp_path / "nope"))
    os.remove(saved / "model.safetensors")
    with pytest.raises(Eagle3Error, match="no weights found"):
        load_draft(str(saved))


def test_truncated_safetensors(saved):
    path = saved / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(Eagle3Error, match="corrupt or truncated"):
        load_draft(str(saved))


def test_corrupt_header(saved):
    (saved / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(Eagle3Error, match="corrupt or truncated"):
        load_draft(str(saved))


def test_wrong_shape(saved):
    rewrite(saved, lambda t: t.__setitem__("fc.weight", torch.zeros(3, 3)))
    with pytest.raises(Eagle3Error, match=r"'fc.weight' has shape \(3, 3\)"):
        load_draft(str(saved))


def test_missing_and_unknown_keys(saved):
    rewrite(saved, lambda t: t.pop("midlayer.hidden_norm.weight"))
    with pytest.raises(Eagle3Error, match="missing tensor 'midlayer.hidden_norm.weight'"):
        load_draft(str(saved))
    rewrite(saved, lambda t: t.update({"midlayer.hidden_norm.weight": torch.ones(64), "layers.1.extra": torch.ones(2)}))
    with pytest.raises(Eagle3Error, match="unknown tensor 'layers.1.extra'"):
        load_draft(str(saved))


def test_nan_weights(saved):
    def poison(t):
        t["norm.weight"][3] = float("nan")
    rewrite(saved, poison)
    with pytest.raises(Eagle3Error, match="'norm.weight' contains NaN or Inf"):
        load_draft(str(saved))


def test_d2t_inconsistent_with_t2d(saved):
    def swap_one_token(t):  # same count in t2d, but one mapped token unmarked
        t["t2d"][int(torch.nonzero(t["t2d"])[0])] = False
        t["t2d"][int(torch.nonzero(~t["t2d"])[-1])] = True
    rewrite(saved, swap_one_token)
    with pytest.raises(Eagle3Error, match="d2t and t2d disagree"):
        load_draft(str(saved))


def test_d2t_not_increasing(saved):
    rewrite(saved, lambda t: t["d2t"].__setitem__(1, t["d2t"][0] - 1))
    with pytest.raises(Eagle3Error, match="strictly increasing"):
        load_draft(str(saved))


def test_d2t_out_of_vocab(saved):
    rewrite(saved, lambda t: t["d2t"].__setitem__(-1, 10_000))
    with pytest.raises(Eagle3Error, match="outside the target vocabulary"):
        load_draft(str(saved))


def test_full_vocab_all_zero_d2t_is_valid(tmp_path, target):
    from conftest import random_draft
    full = random_draft(target, draft_vocab=target.config.vocab_size)
    assert int(full.d2t.abs().sum()) == 0 and bool(full.t2d.all())
    save_draft(full, str(tmp_path / "full"), Eagle3Config())
    assert load_draft(str(tmp_path / "full")).config.draft_vocab_size == target.config.vocab_size
    rewrite(tmp_path / "full", lambda t: (t.pop("d2t"), t.pop("t2d")))  # may be omitted entirely
    load_draft(str(tmp_path / "full"))


def test_vocab_mismatch_and_bad_layers_against_target(saved, target):
    draft = load_draft(str(saved))
    with pytest.raises(Eagle3Error, match="out of range"):
        validate_against_target(draft, target.config, (1, 3, 6), "draft")
    with pytest.raises(Eagle3Error, match="distinct"):
        validate_against_target(draft, target.config, (1, 3, 3), "draft")
    other = type(target.config)(**{**target.config.to_dict(), "vocab_size": 1000})
    with pytest.raises(Eagle3Error, match="vocab_size"):
        validate_against_target(draft, other, (1, 3, 5), "draft")


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/eagle3-pwned",))


def test_pickle_that_runs_code_is_refused(saved):
    os.remove(saved / "model.safetensors")
    with open(saved / "pytorch_model.bin", "wb") as f:
        pickle.dump({"fc.weight": _RunsCode()}, f)
    with pytest.raises(Eagle3Error, match="refused to load"):
        load_draft(str(saved))
    assert not os.path.exists("/tmp/eagle3-pwned")


def test_safe_bin_loads(saved, draft):
    tensors = load_file(str(saved / "model.safetensors"))
    os.remove(saved / "model.safetensors")
    torch.save(tensors, saved / "pytorch_model.bin")
    assert torch.equal(load_draft(str(saved)).fc.weight, draft.fc.weight)


def test_existing_output_refused_and_failed_write_leaves_nothing(tmp_path, draft, monkeypatch):
    out = tmp_path / "d"
    save_draft(draft, str(out), Eagle3Config())
    with pytest.raises(Eagle3Error, match="already exists"):
        save_draft(draft, str(out), Eagle3Config())
    fresh = tmp_path / "fresh"

    def disk_full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("eagle3_plugin.checkpoint.save_file", disk_full)
    with pytest.raises(OSError):
        save_draft(draft, str(fresh), Eagle3Config())
    assert sorted(os.listdir(tmp_path)) == ["d"]


@pytest.mark.parametrize("data, message", [
    ({"depht": 3}, "unknown key 'depht'"),
    ({"mode": "beam"}, "'mode' must be one of"),
    ({"depth": 0}, "'depth' must be a positive integer"),
    ({"top_k": "4"}, "'top_k' must be a positive integer"),
    ({"depth": 2, "top_k": 2, "total_tokens": 20}, "'total_tokens' must be between"),
    ({"mode": "chain", "depth": 3, "top_k": 2}, "'top_k' must be 1 in chain mode"),
    ({"layer_ids": [1, 1, 2]}, "'layer_ids' must be three distinct"),
    ({"tree_sampler": "argmax"}, "'tree_sampler' must be one of"),
])
def test_config_errors_name_the_key(tmp_path, data, message):
    path = tmp_path / "eagle3.json"
    path.write_text(json.dumps(data))
    with pytest.raises(Eagle3Error, match=message):
        Eagle3Config.load(str(path))


def test_config_file_round_trip_and_relative_draft(tmp_path):
    config = Eagle3Config(draft="../d", layer_ids=(1, 2, 4), depth=3, top_k=2, total_tokens=7)
    config.save(str(tmp_path / "eagle3.json"))
    loaded = Eagle3Config.load(str(tmp_path))
    assert loaded.draft == os.path.normpath(str(tmp_path / "../d"))
    assert loaded.to_dict() | {"draft": "../d"} == config.to_dict()
    assert Eagle3Config.from_dict({"mode": "chain", "depth": 3}).total_tokens == 4
