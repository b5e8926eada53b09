"""Data that cannot make a sensible task is refused before any image is decoded, the learner unchanged."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import write_class_folder
from learner_files import hashes
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.engine.loop import TrainConfig
from sbcli.errors import ConfigError, DataError

runner = CliRunner()


def _never(*args, **kwargs):
    raise AssertionError("images were decoded before the refusal")


def test_add_task_refuses_a_test_folder_of_other_classes(one_task_learner, color_data, monkeypatch, tmp_path):
    learner = tmp_path / "learner"
    shutil.copytree(one_task_learner, learner)
    before = hashes(learner)
    monkeypatch.setattr("sbcli.run.add_task.open_spec", _never)
    with pytest.raises(DataError, match=r"does not hold the classes of .*it lacks blue, yellow; it has green, red"):
        api.add_task(learner, color_data["task2_train"], color_data["task1_test"], device="cpu",
                     options=api.AddTaskOptions(epochs=1))
    res = runner.invoke(app, ["add-task", str(learner), str(color_data["task2_train"]), "--test",
                              str(color_data["task1_test"]), "--device", "cpu"])
    assert res.exit_code == 1 and "give a --test folder with the same class folders" in " ".join(res.stderr.split())
    assert hashes(learner) == before


def test_train_refuses_a_test_folder_of_other_classes(color_data, monkeypatch, tmp_path):
    monkeypatch.setattr("sbcli.run.sequence.open_spec", _never)
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task2_test"]), image_size=16)
    run = api.RunOptions(method="std", width=0.125, train=TrainConfig(epochs=1, batch_size=16), memory=8, device="cpu")
    with pytest.raises(DataError, match="does not hold the classes of"):
        api.train(seq, run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_learner_of_a_single_class_is_refused(monkeypatch, tmp_path: Path):
    one = write_class_folder(tmp_path / "one" / "train", ["red"], 8)
    monkeypatch.setattr("sbcli.run.sequence.open_spec", _never)
    run = api.RunOptions(method="std", width=0.125, train=TrainConfig(epochs=1, batch_size=16), memory=8, device="cpu")
    with pytest.raises(ConfigError, match="a single class; a classifier needs at least two"):
        api.train(api.SequenceOptions(source=str(one), image_size=16), run, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    res = runner.invoke(app, ["train", str(one), "--pretrained", "none", "--out", str(tmp_path / "cli"), "--device", "cpu"])
    assert res.exit_code == 1 and "a single class" in res.stderr and not (tmp_path / "cli").exists()
