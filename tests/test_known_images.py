"""`sb add-task` with more images of classes the learner knows: for a ridge head on a frozen backbone, one more
exact accumulation (the same sums, and so the same head, as one joint fit on all the images); refused in one
sentence, before any image is decoded and with the learner's bytes unchanged, for a method that trains its
backbone; a folder of known classes alone is one more step with no new class."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from conftest import write_class_folder
from learner_files import hashes
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.engine.loop import TrainConfig
from sbcli.errors import DataError
from sbcli.hub.card import CardFacts, class_table, model_card
from sbcli.learner.state import Learner
from sbcli.methods import ranpac

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
RIDGE = 10.0  # fixed, so that the head is the ridge solution of the sums alone


def _never(*args, **kwargs):
    raise AssertionError("images were decoded before the refusal")


def _options(backbone: Path) -> api.RunOptions:
    return api.RunOptions(method="ranpac", width=0.125, pretrained=str(backbone), device="cpu",
                          train=TrainConfig(epochs=1, batch_size=16), memory=0,
                          method_options={"projection": 32, "ridge": RIDGE})


def _merge(parts: list[Path], into: Path) -> Path:
    """One class-per-folder tree of every image of ``parts`` (file names kept apart by a prefix)."""
    for i, part in enumerate(parts):
        for image in part.glob("*/*.png"):
            (into / image.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copy(image, into / image.parent.name / f"{i}-{image.name}")
    return into


def _sums(learner: Path) -> tuple[list[str], torch.Tensor, torch.Tensor, torch.Tensor]:
    loaded = Learner.load(learner)
    names = loaded.state.class_names
    state = ranpac.RidgeState.stored(loaded.extra, len(names))
    order = sorted(range(len(names)), key=lambda c: names[c])  # columns by class name
    return sorted(names), state.gram, state.targets[:, order], state.counts[order]


@pytest.mark.parametrize("streams", [True, False], ids=["streamed", "decoded"])
def test_more_images_of_a_known_class_give_the_head_of_one_joint_fit(color_data, one_task_learner, tmp_path,
                                                                     monkeypatch, streams):
    if not streams:  # the path of a learner that keeps exemplars or holds images out: every image decoded
        monkeypatch.setattr("sbcli.run.add_task._streams", lambda learner, trains: False)
    more = write_class_folder(tmp_path / "more", ["green"], 8, seed=3)  # 8 more images of a known class
    step2 = _merge([color_data["task2_train"], more], tmp_path / "step2")  # ... with two new classes
    grown = tmp_path / "grown"
    api.train(api.SequenceOptions(source=str(color_data["task1_train"]), tasks=1), _options(one_task_learner), grown)
    res = runner.invoke(app, ["add-task", str(grown), str(step2), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "8 more images of classes the learner knows" in " ".join(res.output.split())
    joint = tmp_path / "joint"
    api.train(api.SequenceOptions(source=str(_merge([color_data["task1_train"], step2], tmp_path / "all")), tasks=1),
              _options(one_task_learner), joint)

    names, gram, targets, counts = _sums(grown)
    joint_names, joint_gram, joint_targets, joint_counts = _sums(joint)
    assert names == joint_names == ["blue", "green", "red", "yellow"]
    assert counts.tolist() == joint_counts.tolist() == [24, 32, 24, 24]
    assert torch.allclose(gram, joint_gram, rtol=1e-12, atol=0) and torch.allclose(targets, joint_targets, rtol=1e-12)
    head, joint_head = ranpac.solve_ridge(gram, targets, RIDGE), ranpac.solve_ridge(joint_gram, joint_targets, RIDGE)
    assert torch.allclose(head, joint_head, rtol=1e-9, atol=1e-12)  # float64 rounding, not a different fit

    state = Learner.load(grown).state
    assert [h.known_images for h in state.history] == [None, 8]
    assert state.tasks[-1].classes == ["blue", "yellow"] and state.class_names[2:] == ["blue", "yellow"]
    assert '"known_images": 8' in (grown / "learner.json").read_text()
    assert "| 2 | blue, yellow (and 8 more images of classes learned before) |" in class_table(state)


def test_a_trained_method_refuses_known_classes_before_any_work(one_task_learner, color_data, monkeypatch, tmp_path):
    learner = tmp_path / "learner"
    shutil.copytree(one_task_learner, learner)  # --method std
    mixed = _merge([color_data["task2_train"], write_class_folder(tmp_path / "more", ["red"], 4, seed=3)],
                   tmp_path / "mixed")
    before = hashes(learner)
    monkeypatch.setattr("sbcli.run.add_task.open_spec", _never)
    with pytest.raises(DataError, match=r"already knows red \(--method std retrains its backbone at every step, "
                                        r"and the images those classes were learned from are gone"):
        api.add_task(learner, mixed, device="cpu", options=api.AddTaskOptions(epochs=1))
    res = runner.invoke(app, ["add-task", str(learner), str(mixed), "--device", "cpu"])
    assert res.exit_code == 1 and "retrains its backbone" in " ".join(res.stderr.split())
    assert hashes(learner) == before


@pytest.mark.parametrize("method, why", [("simplecil", "keeps its classes as means"),
                                         ("ranpac", "a learner that keeps exemplars")])
def test_a_frozen_learner_that_cannot_add_them_exactly_refuses_known_classes(method, why, color_data, one_task_learner,
                                                                              monkeypatch, tmp_path):
    learner = tmp_path / "learner"
    options = {"method_options": {"projection": 32}, "memory": 8} if method == "ranpac" else {"method_options": {}}
    api.train(api.SequenceOptions(source=str(color_data["task1_train"]), tasks=1),
              dataclasses.replace(_options(one_task_learner), method=method, **options), learner)
    mixed = _merge([color_data["task2_train"], write_class_folder(tmp_path / "more", ["red"], 4, seed=3)],
                   tmp_path / "mixed")
    before = hashes(learner)
    monkeypatch.setattr("sbcli.run.add_task.open_spec", _never)
    with pytest.raises(DataError, match=f"already knows red \\(.*{why}"):
        api.add_task(learner, mixed, device="cpu")
    assert hashes(learner) == before


def test_a_folder_of_known_classes_alone_is_one_more_exact_step(color_data, one_task_learner, tmp_path):
    grown = tmp_path / "grown"
    api.train(api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), tasks=1),
              _options(one_task_learner), grown)
    more = write_class_folder(tmp_path / "more", ["red"], 6, seed=3)  # 6 more images of a known class, nothing new
    res = runner.invoke(app, ["add-task", str(grown), str(more), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "6 more images of classes the learner knows" in said and "no new class" in said
    joint = tmp_path / "joint"
    api.train(api.SequenceOptions(source=str(_merge([color_data["task1_train"], more], tmp_path / "all")), tasks=1),
              _options(one_task_learner), joint)
    names, gram, targets, counts = _sums(grown)
    joint_names, joint_gram, joint_targets, joint_counts = _sums(joint)
    assert names == joint_names == ["green", "red"] and counts.tolist() == joint_counts.tolist() == [24, 30]
    assert torch.allclose(gram, joint_gram, rtol=1e-12, atol=0) and torch.allclose(targets, joint_targets, rtol=1e-12)

    state = Learner.load(grown).state
    assert [h.known_images for h in state.history] == [None, 6] and state.steps == 2
    assert state.tasks[-1].classes == [] and state.class_task == [0, 0]
    assert [h.num_classes for h in state.history] == [2, 2]
    measured = state.history[-1].metrics  # on the test images of task 1: every class is old, none new
    assert len(measured.per_task) == 2 and measured.overall == measured.per_task[0] == measured.old > 50
    assert math.isnan(measured.per_task[1]) and math.isnan(measured.new)
    assert "| 2 | no new class (6 more images of classes learned before) |" in class_table(state)
    card = model_card(state, CardFacts("user/colours", "ridge", 0, 0, ["learner.json"]))
    assert "| 2 | no new class (6 more images of classes learned before) |" in card
    said = " ".join(runner.invoke(app, ["evaluate", str(grown), "--device", "cpu"]).output.split())
    assert "Test images of task 1: 16 from the test set" in said and "task 2" not in said  # it brought no class
    res = runner.invoke(app, ["evaluate", str(grown), "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["metrics"]["overall"] == measured.overall
    res = runner.invoke(app, ["export", str(grown), "--format", "onnx", "-o", str(tmp_path / "m.onnx")])
    assert res.exit_code == 0, res.output
    assert api.rollback(grown, 1) and Learner.load(grown).state.steps == 1
    res = runner.invoke(app, ["add-task", str(grown), str(more), "--device", "cpu"])  # and again after the rollback
    assert res.exit_code == 0, res.output
    assert _sums(grown)[3].tolist() == [24, 30]
