import json
from pathlib import Path

import pytest
import torch

from sbcli import api
from sbcli.engine import TrainConfig
from sbcli.errors import LearnerError
from sbcli.learner import Learner


@pytest.fixture(scope="module")
def learner_dir(color_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("learners") / "colors"
    run = api.RunOptions(method="std", width=0.125, train=TrainConfig(epochs=1, batch_size=16), memory=8, device="cpu")
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), image_size=16, tasks=1)
    api.train(seq, run, out)
    return out


def test_save_load_round_trip(learner_dir, tmp_path):
    learner = Learner.load(learner_dir)
    copy = tmp_path / "copy"
    learner.save(copy)
    again = Learner.load(copy)
    assert again.state == learner.state
    for key, value in learner.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[key]), key
    assert torch.equal(again.memory.images, learner.memory.images)
    assert torch.equal(again.memory.labels, learner.memory.labels)
    assert sorted(p.name for p in copy.iterdir()) == ["learner.json", "memory.safetensors", "model.safetensors",
                                                   "test-sample.safetensors"]
    assert torch.equal(again.test_sample.images, learner.test_sample.images)


def test_learner_json_records_what_the_design_asks(learner_dir):
    state = json.loads((learner_dir / "learner.json").read_text())
    assert state["format_version"] == 1 and state["arch"] == "resnet18" and state["image_size"] == 16
    assert state["class_names"] == ["green", "red"] or state["class_names"] == ["red", "green"]
    assert state["class_task"] == [0, 0]
    assert set(state["normalization"]) == {"mean", "std"}
    assert state["history"][0]["metrics"]["overall"] >= 0
    assert {"sbcli_version", "torch_version", "dataset"} <= set(state["provenance"])


def test_a_crash_while_saving_leaves_the_previous_learner_intact(learner_dir, tmp_path, monkeypatch):
    target = tmp_path / "l"
    Learner.load(learner_dir).save(target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    learner = Learner.load(target)
    learner.state.seed = 123

    def crash(self, folder):
        (folder / "learner.json").write_text("half")
        raise OSError("disk full")

    monkeypatch.setattr(Learner, "_write", crash)
    with pytest.raises(OSError):
        learner.save(target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["l"]  # no temporary left behind


def test_newer_format_and_missing_files_are_refused(learner_dir, tmp_path):
    newer = tmp_path / "newer"
    Learner.load(learner_dir).save(newer)
    state = json.loads((newer / "learner.json").read_text())
    state["format_version"] = 99
    (newer / "learner.json").write_text(json.dumps(state))
    with pytest.raises(LearnerError, match="newer"):
        Learner.load(newer)
    missing = tmp_path / "missing"
    Learner.load(learner_dir).save(missing)
    (missing / "memory.safetensors").unlink()
    with pytest.raises(LearnerError, match="memory.safetensors"):
        Learner.load(missing)
