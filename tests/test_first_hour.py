"""What a new user meets in the first hour: output in logs, --version, closing sentences, hints, JSON."""

from __future__ import annotations

import json
import shutil

from typer.testing import CliRunner

from sbcli import __version__
from sbcli.cli.app import app
from sbcli.cli.progress import step_text
from sbcli.cli.training import closing_line, keeping_hint
from sbcli.jsonutil import strict
from sbcli.learner.records import MemorySettings, Provenance, StepRecord, TaskRecord
from sbcli.metrics import StepMetrics
from sbcli.run.steps import StepSummary

runner = CliRunner()
NAN = float("nan")


def test_output_that_is_not_a_terminal_is_never_wrapped(grown_run, monkeypatch, tmp_path):
    deep = tmp_path.joinpath(*["a-rather-long-folder-name"] * 6)
    learner = deep / "learner"
    shutil.copytree(grown_run["learner"], learner)
    last = json.loads((learner / "learner.json").read_text())["history"][-1]
    monkeypatch.setattr("sbcli.api.add_task", lambda *a, **k: StepSummary(3, 4, StepMetrics(**last["metrics"]), 1.0))
    monkeypatch.delenv("COLUMNS", raising=False)
    res = runner.invoke(app, ["add-task", str(learner), str(tmp_path), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert f"Learner {learner} now knows 4 classes (history.csv" in res.stdout.splitlines()[-1]
    assert max(len(line) for line in res.stdout.splitlines()) > 150  # one line, however long


def test_version_flags():
    for args in (["--version"], ["-V"], ["version"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        assert res.stdout.startswith(f"sbcli {__version__}"), args


def metrics(overall: float, old: float = NAN, new: float = NAN) -> StepMetrics:
    return StepMetrics(overall, [overall], old, new, NAN, NAN)


def test_closing_sentences_say_in_words_what_is_missing():
    untested = [StepRecord(1, 2, metrics(NAN))]
    assert "nan" not in closing_line(untested)
    assert "no test images" in closing_line(untested)
    grown = [StepRecord(1, 2, metrics(90.0)), StepRecord(2, 4, metrics(45.0, old=90.0, new=NAN))]
    line = closing_line(grown)
    assert "nan" not in line and "90.0 % on the 2 old classes" in line and "no test images of the 2 new ones" in line
    both = [grown[0], StepRecord(2, 4, metrics(NAN, old=NAN, new=NAN))]
    assert "nan" not in closing_line(both)
    done = step_text(StepSummary(1, 2, StepMetrics(NAN, [NAN], NAN, NAN, NAN, NAN), 1.0))
    assert done == "step 1 done: 2 classes, no test images to measure it, in 1.0 s"


def test_the_memory_hint_never_asks_for_exemplars_the_data_does_not_have():
    history = [StepRecord(1, 2, metrics(90.0)), StepRecord(2, 4, metrics(50.0, old=10.0, new=90.0))]
    tasks = [TaskRecord(["a", "b"], {"kind": "folder", "name": "x", "train": {"counts": [24, 24]}}),
             TaskRecord(["c", "d"], {"kind": "folder", "name": "y", "train": {"counts": [24, 24]}})]
    small = keeping_hint(history, MemorySettings(8), Provenance(), tasks)
    assert small is not None and "more exemplars" in small  # 2 a class of 24: more would help
    full = keeping_hint(history, MemorySettings(2000), Provenance(), tasks)
    assert full is not None and "more exemplars" not in full and "every training image" in full


def test_json_numbers_are_exact(grown_run):
    """--json prints what learner.json keeps, unrounded (a missing number is null)."""
    stored = json.loads((grown_run["learner"] / "learner.json").read_text())["history"]
    assert json.loads(grown_run["add"].stdout)["history"] == strict(stored)


def test_pulling_the_demo_learner_says_what_sb_evaluate_then_does(tmp_path):
    from sbcli import api

    report = api.pull("demo-sb-tiny", tmp_path / "demo")
    said = " ".join(report.notes)
    assert "--data-root" not in said and "ship with sbcli, so `sb evaluate` works anywhere" in said
    used = api.evaluate(report.path, device="cpu").test_data.tasks
    assert used and all(task.images > 0 for task in used)  # found by itself, as the note says


def test_train_and_add_task_say_what_they_will_do_before_the_first_epoch(color_data, tmp_path):
    learner = tmp_path / "learner"
    small = ["--epochs", "1", "--width", "0.125", "--batch-size", "16", "--memory", "8", "--device", "cpu",
             "--precision", "fp32", "--method", "std"]
    res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--pretrained", "none", "--test", str(color_data["task1_test"]),
                              "--out", str(learner), "--image-size", "24", *small])
    assert res.exit_code == 0, res.output
    lines = res.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Found "))
    assert lines[start] == ("Found 2 classes, 48 training images, 16 test images; at 24x24 pixels (resized from 16x16); "
                            "resnet18, width x0.125; 1 epoch a phase; on cpu in fp32.")  # a folder: no balancing
    assert start < min(i for i, line in enumerate(lines) if " · epoch " in line)  # before any training
    res = runner.invoke(app, ["add-task", str(learner), str(color_data["task2_train"]), "--device", "cpu", "--epochs", "2",
                              "--balance-epochs", "2"])
    assert res.exit_code == 0, res.output
    said = [line for line in res.stderr.splitlines() if line.startswith("Found ")]
    assert said == ["Found 2 classes, 48 training images, no test images; at 24x24 pixels (resized from 16x16); "
                    "resnet18, width x0.125; 2 epochs a phase (and 2 of class-balanced fine-tuning after each later "
                    "step); on cpu in fp32."]
