"""``eagle3 convert`` / ``inspect``: bit-exact round trips between every pair of formats, and one clear
error (exit 2, nothing written) for each kind of bad input."""

import errno
import json
import os
import pickle
import struct
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from bundled import DRAFT, TARGET
from eagle3_plugin.adapters import FORMATS, WRITERS, detect
from eagle3_plugin.cli import main
from eagle3_plugin.checkpoint import read_draft_config, read_tensors
from eagle3_plugin.config import Eagle3Config

def convert(src, to, out, *extra):
    return main(["convert", str(src), "--to", to, "--out", str(out), *extra])


def canonical_tensors(folder):
    from eagle3_plugin.adapters import read
    draft = read(str(folder))
    return {k: t.load() for k, t in draft.tensors.items()}, draft.config, draft.layer_ids


@pytest.fixture(scope="module")
def reference():
    return canonical_tensors(DRAFT)


@pytest.mark.parametrize("first", list(WRITERS))
@pytest.mark.parametrize("second", list(WRITERS))
def test_round_trip_between_every_pair_is_bit_exact(tmp_path, reference, first, second):
    assert convert(DRAFT, first, tmp_path / "a") == 0
    assert convert(tmp_path / "a", second, tmp_path / "b") == 0
    assert convert(tmp_path / "b", "ours", tmp_path / "c") == 0
    tensors, config, layer_ids = canonical_tensors(tmp_path / "c")
    ref_tensors, ref_config, ref_ids = reference
    assert config == ref_config and layer_ids == ref_ids
    assert tensors.keys() == ref_tensors.keys()
    for name, value in ref_tensors.items():
        assert tensors[name].dtype == value.dtype and torch.equal(tensors[name], value), name


def test_detection_and_layer_ids_in_each_convention(tmp_path):
    for fmt in ("eagle", "specforge", "speculators", "vllm", "ours", "sglang"):
        convert(DRAFT, fmt, tmp_path / fmt)
        assert detect(str(tmp_path / fmt)) == {"ours": "vllm", "sglang": "specforge"}.get(fmt, fmt)
        assert Eagle3Config.load(str(tmp_path / fmt)).layer_ids == (1, 3, 5)  # eagle3.json beside every output
    assert json.loads((tmp_path / "specforge" / "config.json").read_text())["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [0, 2, 4]}  # SGLang's convention: ours - 1
    assert json.loads((tmp_path / "speculators" / "config.json").read_text())[
        "eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    assert any(k.startswith("layers.0.") for k in load_file(str(tmp_path / "speculators" / "model.safetensors")))
    assert set(FORMATS) == {"speculators", "specforge", "vllm", "eagle"}


def test_eagle_source_needs_layer_ids_or_a_target(tmp_path, capsys):
    assert main(["convert", DRAFT, "--to", "eagle", "--out", str(tmp_path / "e")]) == 0
    os.remove(tmp_path / "e" / "eagle3.json")  # as released by EAGLE: no capture ids anywhere
    assert main(["convert", str(tmp_path / "e"), "--to", "vllm", "--out", str(tmp_path / "v")]) == 2
    assert "pass --target" in capsys.readouterr().err and not (tmp_path / "v").exists()
    assert main(["convert", str(tmp_path / "e"), "--to", "vllm", "--out", str(tmp_path / "v"), "--target", TARGET]) == 0
    assert json.loads((tmp_path / "v" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]


def test_sharded_and_bin_sources(tmp_path, reference):
    tensors = read_tensors(DRAFT)
    names = sorted(tensors)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text((open(os.path.join(DRAFT, "config.json")).read()))
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, str(sharded / shard))
        weight_map.update({k: shard for k in part})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert convert(sharded, "ours", tmp_path / "from-shards") == 0
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "config.json").write_text((sharded / "config.json").read_text())
    torch.save(tensors, binary / "pytorch_model.bin")
    assert convert(binary, "ours", tmp_path / "from-bin") == 0
    for folder in ("from-shards", "from-bin"):
        got, _, _ = canonical_tensors(tmp_path / folder)
        assert all(torch.equal(got[k], v) for k, v in reference[0].items())


def test_sharded_output_round_trips(tmp_path, reference):
    assert convert(DRAFT, "speculators", tmp_path / "sharded", "--shard-size", "0.5") == 0
    files = sorted(os.listdir(tmp_path / "sharded"))
    assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 2
    assert convert(tmp_path / "sharded", "ours", tmp_path / "back") == 0
    got, config, ids = canonical_tensors(tmp_path / "back")
    assert ids == (1, 3, 5) and all(torch.equal(got[k], v) for k, v in reference[0].items())


# -- bad inputs: one message, exit 2, nothing written ------------------------------------------------

@pytest.fixture
def src(tmp_path):
    out = tmp_path / "src"
    assert convert(DRAFT, "vllm", out) == 0
    return out


def edit(folder, change):
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def refused(tmp_path, capsys, src, message):
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["convert", str(src), "--to", "ours", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], err
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".out")]


def test_truncated_safetensors(tmp_path, capsys, src):
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) - 1000])
    refused(tmp_path, capsys, src, "corrupt or truncated")


def test_wrong_shape(tmp_path, capsys, src):
    edit(src, lambda t: t.__setitem__("norm.weight", torch.ones(7)))
    refused(tmp_path, capsys, src, "'norm.weight' has shape (7,)")


def test_missing_key(tmp_path, capsys, src):
    edit(src, lambda t: t.pop("midlayer.mlp.up_proj.weight"))
    refused(tmp_path, capsys, src, "missing tensor 'midlayer.mlp.up_proj.weight'")


def test_extra_unknown_key(tmp_path, capsys, src):
    edit(src, lambda t: t.__setitem__("midlayer.rotary.inv_freq", torch.ones(4)))
    refused(tmp_path, capsys, src, "unknown tensor 'midlayer.rotary.inv_freq'")


def test_d2t_inconsistent_with_t2d(tmp_path, capsys, src):
    def unmark(t):
        t["t2d"][int(torch.nonzero(t["t2d"])[3])] = False
        t["t2d"][int(torch.nonzero(~t["t2d"])[-1])] = True
    edit(src, unmark)
    refused(tmp_path, capsys, src, "d2t and t2d disagree")


def test_nan_weights(tmp_path, capsys, src):
    edit(src, lambda t: t["fc.weight"].__setitem__((0, 0), float("nan")))
    refused(tmp_path, capsys, src, "'fc.weight' contains NaN or Inf")


def test_pickle_that_runs_code_is_refused(tmp_path, capsys, src):
    class RunsCode:
        def __reduce__(self):
            return (os.system, ("touch /tmp/eagle3-convert-pwned",))
    os.remove(src / "model.safetensors")
    with open(src / "pytorch_model.bin", "wb") as f:
        pickle.dump({"fc.weight": RunsCode()}, f)
    refused(tmp_path, capsys, src, "refused to load")
    assert not os.path.exists("/tmp/eagle3-convert-pwned")


def test_all_zero_d2t_with_full_vocab_is_valid(tmp_path, src):
    config = read_draft_config(str(src))
    full = json.loads((src / "config.json").read_text()) | {"draft_vocab_size": config.vocab_size}
    (src / "config.json").write_text(json.dumps(full))

    def widen(t):
        t["lm_head.weight"] = torch.randn(config.vocab_size, config.hidden_size)
        t["d2t"] = torch.zeros(config.vocab_size, dtype=torch.long)
        t["t2d"] = torch.ones(config.vocab_size, dtype=torch.bool)
    edit(src, widen)
    assert main(["convert", str(src), "--to", "specforge", "--out", str(tmp_path / "sf")]) == 0
    assert main(["convert", str(src), "--to", "vllm", "--out", str(tmp_path / "v")]) == 0
    assert "d2t" not in load_file(str(tmp_path / "v" / "model.safetensors"))  # vLLM refuses d2t at full vocab


def test_existing_output_refused_unless_force(tmp_path, capsys, src):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["convert", str(src), "--to", "ours", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err and (out / "keep.txt").exists()
    assert main(["convert", str(src), "--to", "ours", "--out", str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and detect(str(out)) == "vllm"


def test_disk_full_leaves_nothing(tmp_path, capsys, src, monkeypatch):
    import eagle3_plugin.weights as weights

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    # the writer's own view of struct, not the module every other user in this process shares
    monkeypatch.setattr(weights, "struct", SimpleNamespace(pack=full, unpack=struct.unpack, error=struct.error))
    refused(tmp_path, capsys, src, "writing failed ([Errno 28] No space left on device); nothing was written")


def test_inspect_lists_every_problem(tmp_path, capsys, src):
    assert main(["inspect", str(src), "--target", TARGET]) == 0
    assert "sglang [0, 2, 4]" in capsys.readouterr().out
    edit(src, lambda t: (t.__setitem__("norm.weight", torch.full((128,), float("inf"))), t.pop("fc.weight")))
    assert main(["inspect", str(src), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "vllm"
    assert any("missing tensor 'fc.weight'" in p for p in report["problems"])
    assert any("'norm.weight' contains NaN or Inf" in p for p in report["problems"])


# -- inputs a careless or hostile source folder may hold ----------------------------------------------

def sharded(tmp_path, weight_map_of=None):
    """The bundled draft in two shards; ``weight_map_of(shard_name) -> name`` rewrites the index's file names."""
    tensors = read_tensors(DRAFT)
    names = sorted(tensors)
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(open(os.path.join(DRAFT, "config.json")).read())
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, str(folder / shard))
        weight_map.update({k: (weight_map_of or (lambda s: s))(shard) for k in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("where", ["../x.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_shard_index_pointing_outside_the_folder(tmp_path, capsys, where):
    src = sharded(tmp_path, lambda shard: where if shard.startswith("model-00002") else shard)
    refused(tmp_path, capsys, src, "outside the checkpoint folder")


def test_missing_shard(tmp_path, capsys):
    src = sharded(tmp_path)
    os.remove(src / "model-00002-of-00002.safetensors")
    refused(tmp_path, capsys, src, "model-00002-of-00002.safetensors")


def test_malformed_config(tmp_path, capsys, src):
    (src / "config.json").write_text('{"hidden_size": 128,')
    refused(tmp_path, capsys, src, "config.json")


def test_wrong_dtype(tmp_path, capsys, src):
    edit(src, lambda t: t.__setitem__("norm.weight", t["norm.weight"].to(torch.int32)))
    refused(tmp_path, capsys, src, "'norm.weight'")


@pytest.mark.parametrize("change, message", [
    ({"vocab_size": 4096}, "vocab"),
    ({"hidden_size": 256}, "hidden"),
    ({"num_hidden_layers": 4}, "layer"),
])
def test_target_that_does_not_fit(tmp_path, capsys, src, change, message):
    import shutil
    target = tmp_path / "target"
    shutil.copytree(TARGET, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **change}))
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["convert", str(src), "--to", "ours", "--out", str(out), "--target", str(target)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0].lower(), errors
    assert not out.exists()


def test_dangling_symlink_output(tmp_path, capsys, src):
    out = tmp_path / "out"
    os.symlink(tmp_path / "nowhere", out)
    capsys.readouterr()
    assert main(["convert", str(src), "--to", "ours", "--out", str(out)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "symlink" in errors[0], errors
    assert os.path.islink(out) and not (tmp_path / "nowhere").exists()


def test_output_equal_to_the_source_even_with_force(tmp_path, capsys, src):
    before = sorted(os.listdir(src))
    capsys.readouterr()
    assert main(["convert", str(src), "--to", "ours", "--out", str(src), "--force"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "source" in errors[0], errors
    assert sorted(os.listdir(src)) == before and detect(str(src)) == "vllm"


def test_probe_finds_capture_ids_recorded_one_layer_off(tmp_path, capsys):
    """A draft whose config records ids one layer below what it was trained on: the probe shows the reading one
    layer higher accepts more, and warns."""
    from bundled import HELDOUT
    off = tmp_path / "off"
    assert convert(DRAFT, "ours", off, "--layers", "0,2,4") == 0
    capsys.readouterr()
    assert main(["inspect", str(off), "--target", TARGET, "--probe", "--prompts", HELDOUT, "--max-prompts", "3"]) == 0
    out = capsys.readouterr().out
    assert "WARNING: the recorded capture ids are not the best reading: one layer higher [1, 3, 5]" in out
    capsys.readouterr()
    assert main(["inspect", DRAFT, "--target", TARGET, "--probe", "--prompts", HELDOUT, "--max-prompts", "3",
                 "--json"]) == 0
    probe = json.loads(capsys.readouterr().out)["probe"]
    best = max(probe, key=lambda r: r["mean_acceptance_length"])
    assert best["reading"] == "as recorded" and best["layer_ids"] == [1, 3, 5]


def test_convert_warns_where_the_reading_is_ambiguous(tmp_path, capsys):
    assert convert(DRAFT, "sglang", tmp_path / "sgl") == 0
    capsys.readouterr()
    assert convert(tmp_path / "sgl", "ours", tmp_path / "back") == 0
    assert "one layer lower to SGLang/SpecForge" in capsys.readouterr().err
