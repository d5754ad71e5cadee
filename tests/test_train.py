"""``eagle3 train``: TTT mask, vocabulary mapping, outputs, resume, and input errors."""

import itertools
import json
import os

import pytest
import torch

from bundled import TARGET
from eagle3_plugin.checkpoint import load_draft
from eagle3_plugin.cli import main
from eagle3_plugin.config import Eagle3Config
from eagle3_plugin.train import loop
from eagle3_plugin.train.data import Example, draft_vocabulary
from eagle3_plugin.train.loop import TrainArgs, train
from eagle3_plugin.train.ttt import ttt_mask


def test_ttt_mask_is_causal_prefix_plus_own_earlier_steps():
    mask = ttt_mask(4, 2)
    assert mask.shape == (4, 12)
    assert torch.equal(mask[:, :4], torch.ones(4, 4, dtype=torch.bool).tril())
    assert torch.equal(mask[:, 4:8], torch.eye(4, dtype=torch.bool))
    assert torch.equal(mask[:, 8:], torch.eye(4, dtype=torch.bool))


def test_draft_vocabulary_keeps_the_most_frequent_tokens_in_id_order():
    examples = [Example([5, 3, 3, 9, 9, 9, 1], [0, 1, 1, 1, 1, 1, 1])]  # 5 is prompt: not counted
    d2t, t2d = draft_vocabulary(examples, vocab_size=12, draft_vocab_size=3)
    assert (torch.arange(3) + d2t).tolist() == [1, 3, 9]
    assert torch.nonzero(t2d).flatten().tolist() == [1, 3, 9]


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "train.jsonl"
    prompts = [json.loads(line)["prompt"] for line in open(os.path.join(os.path.dirname(TARGET), "prompts",
                                                                         "heldout.jsonl"))][:6]
    path.write_text("".join(json.dumps({"prompt": p, "response": "    return None\n"}) + "\n" for p in prompts)
                    + json.dumps({"text": "import os\nprint(os.getcwd())\n"}) + "\n")
    return str(path)


def args(data, out, **kw):
    return TrainArgs(target=TARGET, data=[data], out=str(out), draft_vocab=256, max_steps=6, ttt_steps=3,
                     batch_size=2, save_every=2, **kw)


def test_train_writes_a_loadable_draft_with_config(tmp_path, data):
    out = tmp_path / "draft"
    assert main(["train", "--target", TARGET, "--data", data, "--out", str(out), "--draft-vocab", "256",
                 "--max-steps", "3", "--ttt-steps", "2", "--layers", "1,2,4"]) == 0
    draft = load_draft(str(out))
    assert draft.config.draft_vocab_size == 256
    assert Eagle3Config.load(str(out)).layer_ids == (1, 2, 4)
    assert json.loads((out / "training.json").read_text())["steps"] == 3
    assert not os.path.exists(str(out) + ".partial")


def test_interrupted_training_resumes_to_the_same_weights(tmp_path, data, monkeypatch):
    straight = tmp_path / "straight"
    train(args(data, straight))
    clock = itertools.count(0, 25.0)  # each look at the clock: 25 s later, so a 1-minute budget stops early
    with monkeypatch.context() as m:
        m.setattr(loop.time, "monotonic", lambda: next(clock))
        resumed = tmp_path / "resumed"
        train(args(data, resumed, max_minutes=1.0))
    partial = json.loads((resumed / "training.json").read_text())["steps"]
    assert 0 < partial < 6 and os.path.exists(str(resumed) + ".partial")
    train(args(data, resumed))
    assert json.loads((resumed / "training.json").read_text())["steps"] == 6
    a, b = load_draft(str(straight)).state_dict(), load_draft(str(resumed)).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_train_input_errors(tmp_path, data, capsys):
    out = tmp_path / "d"
    out.mkdir()
    assert main(["train", "--target", TARGET, "--data", data, "--out", str(out), "--max-steps", "1"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["train", "--target", TARGET, "--data", data, "--out", str(tmp_path / "e"),
                 "--layers", "1,1,4"]) == 2
    assert "--layers" in capsys.readouterr().err
    no_response = tmp_path / "p.jsonl"
    no_response.write_text('{"prompt": "def f():"}\n')
    assert main(["train", "--target", TARGET, "--data", str(no_response), "--out", str(tmp_path / "f")]) == 2
    assert "--regenerate" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "e") and not os.path.exists(tmp_path / "f")
