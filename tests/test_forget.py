"""`sb forget`: classes taken out of a ridge learner as a new step. With their training images the sums equal
those of a learner never taught them, to float64's rounding; without, the head alone lets them go. Refusals
come before any image is decoded, with the learner's bytes unchanged; `sb rollback` undoes the step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import interrupted_sequence, write_class_folder
from learner_files import hashes
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.engine.loop import TrainConfig
from sbcli.errors import ConfigError, DataError
from sbcli.hub.card import CardFacts, model_card
from sbcli.learner.state import Learner
from sbcli.methods import ranpac
from sbcli.methods.rules.ridge import HEAD_KEY

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
RIDGE = 10.0  # fixed, so that the head is the ridge solution of the sums alone


def _options(backbone: Path, **changes) -> api.RunOptions:
    return api.RunOptions(**{"method": "ranpac", "width": 0.125, "pretrained": str(backbone), "device": "cpu",
                             "train": TrainConfig(epochs=1, batch_size=16), "memory": 0,
                             "method_options": {"projection": 32, "ridge": RIDGE}, **changes})


def _only(folder: Path, classes: list[str], into: Path) -> Path:
    for name in classes:
        shutil.copytree(folder / name, into / name)
    return into


def _two_tasks(color_data, backbone: Path, out: Path, second: Path, second_test: Path) -> Path:
    api.train(api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), tasks=1),
              _options(backbone), out)
    api.add_task(out, second, second_test, device="cpu")
    return out


def _by_name(learner: Path) -> dict:
    loaded = Learner.load(learner)
    names = loaded.state.class_names
    state = ranpac.RidgeState.stored(loaded.extra, len(names))
    order = sorted(range(len(names)), key=lambda c: names[c])
    return {"names": sorted(names), "gram": state.gram, "targets": state.targets[:, order],
            "counts": state.counts[order], "head": loaded.extra[HEAD_KEY][order], "state": loaded.state}


@pytest.fixture
def grown(color_data, one_task_learner, tmp_path) -> Path:
    """A ridge learner of two tasks: red, green, then blue, yellow (each with its test images)."""
    return _two_tasks(color_data, one_task_learner, tmp_path / "grown", color_data["task2_train"], color_data["task2_test"])


def test_with_its_images_a_class_leaves_as_if_it_had_never_been_taught(grown, color_data, one_task_learner, tmp_path):
    blue = _only(color_data["task2_train"], ["blue"], tmp_path / "blue")
    res = runner.invoke(app, ["forget", str(grown), "blue", "--data", str(blue), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "took out blue exactly" in " ".join(res.stdout.split())
    never = _two_tasks(color_data, one_task_learner, tmp_path / "never",
                       _only(color_data["task2_train"], ["yellow"], tmp_path / "yellow"),
                       _only(color_data["task2_test"], ["yellow"], tmp_path / "yellow-test"))
    after, alone = _by_name(grown), _by_name(never)
    assert after["names"] == alone["names"] == ["green", "red", "yellow"]
    assert after["counts"].tolist() == alone["counts"].tolist() == [24, 24, 24]
    scale = float(alone["gram"].abs().max())
    assert torch.allclose(after["gram"], alone["gram"], rtol=0, atol=1e-12 * scale)  # float64 rounding
    assert torch.allclose(after["targets"], alone["targets"], rtol=1e-12)
    head, head_alone = (ranpac.solve_ridge(s["gram"], s["targets"], RIDGE) for s in (after, alone))
    assert torch.allclose(head, head_alone, rtol=1e-8, atol=1e-12)

    state = after["state"]
    assert state.steps == 3 and state.class_names == ["red", "green", "yellow"] and state.class_task == [0, 0, 1]
    assert state.history[-1].forgotten == ["blue"] and state.history[-1].record["exact"] is True
    assert state.tasks[-1].classes == [] and state.tasks[1].classes == ["blue", "yellow"]
    assert state.test_sample.counts == [8, 8, 8] and state.history[-1].metrics.overall > 50
    assert len(state.history[-1].metrics.per_task) == 3  # a column for each step, its own empty
    assert json.loads((grown / "learner.json").read_text())["history"][-1]["forgotten"] == ["blue"]
    card = model_card(state, CardFacts("user/colours", "ridge", 0, 0, ["learner.json"]))
    assert "| 3 | no new class (took out blue) |" in card
    res = runner.invoke(app, ["evaluate", str(grown), "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["classes"] == 3
    res = runner.invoke(app, ["export", str(grown), "--format", "onnx", "-o", str(tmp_path / "m.onnx")])
    assert res.exit_code == 0, res.output

    api.rollback(grown, 2)  # undone like any step
    assert Learner.load(grown).state.class_names == ["red", "green", "blue", "yellow"]


def test_without_images_a_class_leaves_the_head_alone(grown):
    before = _by_name(grown)
    res = runner.invoke(app, ["forget", str(grown), "yellow", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "from the head alone" in said and "their images stay in the head's sums" in said
    after = _by_name(grown)
    assert after["names"] == ["blue", "green", "red"] and torch.equal(after["gram"], before["gram"])
    assert torch.equal(after["head"], before["head"][[0, 1, 2]])  # the other classes' rows as they were
    assert after["state"].history[-1].record == {"exact": False}
    assert after["state"].history[-1].forgotten == ["yellow"]


def test_refusals_come_before_any_work_and_leave_the_learner_unchanged(grown, color_data, one_task_learner,
                                                                       monkeypatch, tmp_path):
    before = hashes(grown)
    few = tmp_path / "few" / "blue"
    few.mkdir(parents=True)
    for image in sorted((color_data["task2_train"] / "blue").iterdir())[:20]:
        shutil.copy(image, few / image.name)
    other = write_class_folder(tmp_path / "other", ["blue"], 24, seed=9)  # as many images, not those it was taught
    cases = [(["purple"], None, ConfigError, "does not know 'purple'"),
             (["red", "green", "blue", "yellow"], None, ConfigError, "every class"),
             (["blue"], tmp_path / "few", DataError, "learned blue from 24 images but --data holds 20"),
             (["blue"], other, DataError, "not the ones the learner was taught"),
             (["blue"], color_data["task2_train"], DataError, "holds yellow, which this command does not take out"),
             (["blue", "yellow"], _only(color_data["task2_train"], ["blue"], tmp_path / "b"), DataError,
              "no folder of yellow")]
    for classes, data, error, said in cases:
        with pytest.raises(error, match=said):
            api.forget(grown, classes, data, device="cpu")
        assert hashes(grown) == before
    res = runner.invoke(app, ["forget", str(grown), "purple"])
    assert res.exit_code != 0 and "does not know 'purple'" in " ".join(res.output.split())
    monkeypatch.setattr("sbcli.run.forget.stream_features", lambda *a: pytest.fail("an image was passed"))
    trained = tmp_path / "trained"
    shutil.copytree(one_task_learner, trained)
    before = hashes(trained)
    with pytest.raises(ConfigError, match="is --method std, whose classes leave without their images: drop --data"):
        api.forget(trained, ["red"], color_data["task1_train"], device="cpu")
    assert hashes(trained) == before


def test_a_trained_network_loses_its_head_rows_and_exemplars_and_says_its_backbone_keeps_them(one_task_learner,
                                                                                               tmp_path):
    learner = tmp_path / "trained"
    shutil.copytree(one_task_learner, learner)  # --method std, memory 8: red, green
    was = Learner.load(learner)
    res = runner.invoke(app, ["forget", str(learner), "red", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "backbone keeps what it learned from them" in " ".join(res.output.split())
    now = Learner.load(learner)
    assert now.state.class_names == ["green"] and now.model.num_classes == 1
    assert torch.equal(now.model.head.weight, was.model.head.weight[[1]])
    assert now.memory.labels.tolist() == [0] * int((was.memory.labels == 1).sum())
    assert torch.equal(now.memory.images, was.memory.images[was.memory.labels == 1])
    assert now.state.history[-1].record == {"exact": False}
    backbone = [k for k in was.model.state_dict() if not k.startswith("head.")]
    assert all(torch.equal(now.model.state_dict()[k], was.model.state_dict()[k]) for k in backbone)


def test_simplecil_prototypes_left_are_those_of_a_learner_never_taught_the_class(color_data, one_task_learner,
                                                                               tmp_path):
    from sbcli.methods.rules.prototype import PROTOTYPES_KEY

    options = _options(one_task_learner, method="simplecil", method_options={})
    learner, never = tmp_path / "all", tmp_path / "never"
    for out, second, test in ((learner, color_data["task2_train"], color_data["task2_test"]),
                              (never, _only(color_data["task2_train"], ["yellow"], tmp_path / "y"),
                               _only(color_data["task2_test"], ["yellow"], tmp_path / "yt"))):
        api.train(api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]),
                                      tasks=1), options, out)
        api.add_task(out, second, test, device="cpu")
    step = api.forget(learner, ["blue"], device="cpu")
    assert step.num_classes == 3 and "never taught" in step.notes[0]
    after, alone = Learner.load(learner), Learner.load(never)
    assert after.state.class_names == alone.state.class_names == ["red", "green", "yellow"]
    assert torch.allclose(after.extra[PROTOTYPES_KEY], alone.extra[PROTOTYPES_KEY], rtol=1e-6, atol=1e-7)
    assert after.state.history[-1].record == {"exact": True} and step.metrics.overall > 50


def test_an_lda_head_is_solved_again_from_the_sums_left(color_data, one_task_learner, tmp_path):
    from sbcli.methods.rules import lda

    options = _options(one_task_learner, method_options={"projection": 32, "inference": "lda"})
    learner = tmp_path / "lda"
    api.train(api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), tasks=1),
              options, learner)
    api.add_task(learner, color_data["task2_train"], color_data["task2_test"], device="cpu")
    api.forget(learner, ["blue"], _only(color_data["task2_train"], ["blue"], tmp_path / "blue"), device="cpu")
    loaded = Learner.load(learner)
    record = loaded.state.history[-1].record
    state = ranpac.RidgeState.stored(loaded.extra, 3)
    weights, bias = lda.solve_lda(state.gram, state.targets, state.counts, record["shrinkage"])
    t = record["temperature"]
    assert torch.allclose(loaded.extra[HEAD_KEY], (weights / t).T.float(), rtol=1e-5, atol=1e-6)
    assert torch.allclose(loaded.extra[lda.BIAS_KEY], (bias / t).float(), rtol=1e-5, atol=1e-6)
    assert loaded.state.history[-1].metrics.overall > 50


def test_a_sequence_sb_train_has_not_finished_is_refused_before_any_work(color_data, tmp_path):
    """`sb train --resume` goes on from the learner's step count in its planned class order: a forget in between
    would skip a planned task, so it is refused until the sequence is finished, the learner unchanged."""
    _, out = interrupted_sequence(color_data, tmp_path)
    learned = Learner.load(out, "cpu").state.class_names
    before = hashes(out)
    result = CliRunner().invoke(app, ["forget", str(out), learned[0]])
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "1 of the 2 tasks" in said and "--resume" in said, result.output
    assert "Traceback" not in result.output and hashes(out) == before
