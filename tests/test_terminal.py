"""What a person sees and keeps: progress on stderr, the runs folder, history.csv, accuracy.png, logs, JSON."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sbcli.cli import progress
from sbcli.cli.app import app
from sbcli.cli.rundirs import next_run_dir, output_dir, run_name
from sbcli.learner.state import read_state
from sbcli.metrics import StepMetrics
from sbcli.run import plots
from sbcli.run.steps import StepSummary

runner = CliRunner()
LINE = re.compile(r"^step (\d)/(\d) · phase (\w+) · epoch (\d+)/(\d+) · loss \d+\.\d{4} · [\d,]+ img/s · fp32 · "
                  r"ETA step \d+:\d\d, sequence \d+:\d\d$")


def history(run: dict) -> list[dict]:
    return json.loads((run["learner"] / "learner.json").read_text())["history"]


# -- the runs folder --


def test_train_without_out_writes_runs_source_and_says_where(grown_run):
    assert grown_run["learner"] == grown_run["cwd"] / "runs" / "train"
    assert "Training sb on" in grown_run["train"].stderr and "→ runs/train" in grown_run["train"].stderr
    assert json.loads(grown_run["train"].stdout)["learner"] == "runs/train"


def test_each_new_run_gets_the_next_free_folder(grown_run, color_data, monkeypatch, tmp_path):
    cwd = tmp_path / "again"
    shutil.copytree(grown_run["cwd"] / "runs", cwd / "runs", ignore=shutil.ignore_patterns("tensorboard"))
    monkeypatch.chdir(cwd)
    wrote = []

    def fake_train(seq, run, out, **kwargs):
        out.mkdir(parents=True)
        wrote.append(out)
        return SimpleNamespace(state=SimpleNamespace(history=[]))

    from sbcli import api

    real_train = api.train
    monkeypatch.setattr("sbcli.api.train", fake_train)
    for expected in ("runs/train-2", "runs/train-3"):
        res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--pretrained", "none", "--device", "cpu", "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["learner"] == expected and wrote[-1] == Path(expected)
    monkeypatch.setattr("sbcli.api.train", real_train)
    res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--pretrained", "none", "--out", "runs/train", "--device", "cpu"])
    assert res.exit_code == 1 and "already holds a learner" in " ".join(res.stderr.split())  # --out keeps refusing


def test_run_names_and_resume_needs_out(tmp_path):
    assert run_name(None) == "demo" and run_name("cifar100") == "cifar100"
    assert run_name("../data/tiny-imagenet-100.zip") == "tiny-imagenet-100" and run_name("./photos/my train/") == "my-train"
    assert run_name("cifar100", recipe="paper-10") == "paper-10" and run_name(None, recipe="r/my.toml") == "my"
    assert next_run_dir("x", tmp_path) == tmp_path / "x"
    (tmp_path / "x").mkdir()
    (tmp_path / "x-2").mkdir()
    assert next_run_dir("x", tmp_path) == tmp_path / "x-3"
    assert output_dir("mine", False, None) == Path("mine")
    with pytest.raises(Exception, match="--resume needs --out"):
        output_dir(None, True, "cifar100")


# -- progress --


def test_progress_is_one_line_per_epoch_when_stderr_is_not_a_terminal(grown_run):
    lines = grown_run["train"].stderr.splitlines()
    epochs = [LINE.match(line) for line in lines if line.startswith("step ") and " · phase " in line]
    assert epochs and all(epochs), lines
    phases = [(m[1], m[3]) for m in epochs]
    # 1 epoch each, S&B's three phases at step 2, then the default balancing's 2 epochs
    assert phases == [("1", "base"), ("2", "A"), ("2", "B"), ("2", "C"), ("2", "balance"), ("2", "balance")]
    assert any(line.startswith("step 1 done: 1 classes, accuracy") for line in lines)
    json.loads(grown_run["train"].stdout)  # stdout is the result alone


def test_quiet_prints_nothing_on_stderr(grown_run):
    assert grown_run["add"].stderr == ""
    assert json.loads(grown_run["add"].stdout)["step"] == 3


class Event(SimpleNamespace):
    pass


def summary(step: int, classes: int) -> StepSummary:
    return StepSummary(step, classes, StepMetrics(80.0, [80.0] * step, 70.0, 90.0, 75.0, 95.0), 1.5)


def feed(reporter, plan: dict[int, list[tuple[str, int]]], batches: int = 3) -> None:
    """Drive a reporter as the engine and the API would: plan, batches, epochs, steps."""
    reporter.on_plan({task: sum(e for _, e in phases) for task, phases in plan.items()})
    for task, phases in plan.items():
        for phase, epochs in phases:
            for epoch in range(1, epochs + 1):
                for b in range(1, batches + 1):
                    getattr(reporter, "on_batch", lambda *a: None)(b, batches)
                reporter(Event(task=task, phase=phase, epoch=epoch, epochs=epochs, loss=0.5, images_per_s=1234.0,
                               precision="bf16", lr=0.1))
        reporter.on_step(summary(task, 2 * task))


def test_live_bars_on_a_terminal_show_phase_step_and_sequence():
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=140, color_system=None)
    reporter = progress.reporter(False, console=console)
    assert isinstance(reporter, progress.LiveReporter)
    with reporter:
        feed(reporter, {1: [("base", 2)], 2: [("A", 1), ("B", 1), ("C", 1)]})
        with reporter.status("Checking the ONNX model"):
            pass
    text = buffer.getvalue()
    for part in ("phase A", "phase C", "step 2/2", "loss 0.5000", "1,234 img/s", "bf16", "ETA", "elapsed",
                 "step 1 done: 2 classes", "step 2 done: 4 classes"):
        assert part in text, part
    assert reporter.timeline.totals(2) == (3.0, 3, 5.0, 5)


def test_reporter_kinds_and_lines_output():
    pipe = Console(file=io.StringIO(), force_terminal=False, width=200)
    assert type(progress.reporter(True, console=pipe)) is progress.Reporter
    lines = progress.reporter(False, every=2, console=pipe)
    assert isinstance(lines, progress.LineReporter)
    with lines:
        feed(lines, {1: [("base", 3)]})
    out = pipe.file.getvalue().splitlines()
    # the first (the rate and ETA, early), every 2nd and the last
    assert [line.split(" · ")[2] for line in out if "phase" in line] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]
    quiet = Console(file=io.StringIO(), force_terminal=True)
    with progress.reporter(True, console=quiet) as reporter:
        feed(reporter, {1: [("base", 2)]})
    assert quiet.file.getvalue() == ""


# -- results as files --


def test_history_csv_equals_the_learners_history(grown_run):
    steps = history(grown_run)
    with (grown_run["learner"] / "history.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [1, 2, 3] and [int(r["classes"]) for r in rows] == [1, 2, 4]
    for row, h in zip(rows, steps, strict=True):
        m = h["metrics"]
        for column, key in (("accuracy", "overall"), ("old", "old"), ("new", "new"), ("intra_old", "intra_old"),
                            ("intra_new", "intra_new")):
            expected = m[key]
            assert row[column] == ("" if expected is None or math.isnan(expected) else str(round(expected, 2)))
        assert float(row["seconds"]) == round(h["seconds"], 1)
        seconds = sum(p["seconds"] for p in h["phases"])
        assert float(row["images_per_s"]) == pytest.approx(
            sum(p["images_per_s"] * p["seconds"] for p in h["phases"]) / seconds, abs=0.051)
    assert rows[0]["forgetting"] == ""
    per_task = [h["metrics"]["per_task"] for h in steps]
    drops = [max(per_task[t][j] for t in range(j, 2)) - per_task[2][j] for j in range(2)]
    assert float(rows[2]["forgetting"]) == round(sum(drops) / 2, 2)


def test_accuracy_png_is_drawn_after_each_step(grown_run):
    if not plots.available():
        pytest.skip("the plots extra (matplotlib) is not installed")
    from PIL import Image

    with Image.open(grown_run["learner"] / "accuracy.png") as img:
        assert img.format == "PNG" and img.size == (880, 462)  # 8 x 4.2 inches at 110 dpi
    assert not list(grown_run["learner"].glob(".*tmp*"))


def test_add_task_ends_with_the_same_tables_as_train(grown_run, monkeypatch, tmp_path):
    learner = tmp_path / "learner"
    shutil.copytree(grown_run["learner"], learner)
    last = history(grown_run)[-1]
    step = StepSummary(3, 4, StepMetrics(**last["metrics"]), 1.0, state=read_state(learner))  # as api.add_task returns it
    monkeypatch.setattr("sbcli.api.add_task", lambda *a, **k: step)
    res = runner.invoke(app, ["add-task", str(learner), str(tmp_path), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    for title in ("Accuracy after each step", "Split-and-Bridge ablation", "Summary", "now knows 4 classes"):
        assert title in res.stdout
    assert "per task" not in res.stdout


def test_evaluate_matrix(grown_run):
    res = runner.invoke(app, ["evaluate", str(grown_run["learner"]), "--matrix", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "Accuracy matrix" in res.stdout and "task 3" in res.stdout and "after 3" in res.stdout
    assert "per task" not in res.stdout


# -- experiment logs, read back with the libraries' own readers --


def test_tensorboard_log_holds_the_learners_history(grown_run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(grown_run["cwd"] / "runs" / "tensorboard" / "train"))
    events.Reload()
    steps = history(grown_run)
    accuracy = [(e.step, e.value) for e in events.Scalars("step/accuracy")]
    assert [s for s, _ in accuracy] == [1, 2, 3]
    assert [v for _, v in accuracy] == pytest.approx([h["metrics"]["overall"] for h in steps], rel=1e-6)
    losses = [e.value for e in events.Scalars("epoch/loss")]
    assert len(losses) == sum(p["epochs"] for h in steps for p in h["phases"])
    phases = [p for h in steps for p in h["phases"]]
    ends = [sum(p["epochs"] for p in phases[: i + 1]) - 1 for i in range(len(phases))]  # each phase's last epoch
    assert [losses[i] for i in ends] == pytest.approx([p["final_loss"] for p in phases], rel=1e-6, abs=1e-7)
    # 1 epoch a phase: no decay, at the lr the learner records; the balancing after step 2 (2 epochs) at its own
    lr = json.loads((grown_run["learner"] / "learner.json").read_text())["train_config"]["lr"]
    expected_lr = [x for p in phases for x in ([0.01, 0.001] if p["name"] == "balance" else [lr] * p["epochs"])]
    assert [e.value for e in events.Scalars("epoch/lr")] == pytest.approx(expected_lr)
    assert [e.step for e in events.Scalars("epoch/loss")] == list(range(1, len(losses) + 1))  # add-task goes on counting
    assert any(tag.startswith("options") for tag in events.Tags()["tensors"])


def test_mlflow_log_holds_the_learners_history(grown_run, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient((grown_run["cwd"] / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("sbcli")
    runs = sorted(client.search_runs([experiment.experiment_id]), key=lambda r: r.info.start_time)
    assert len(runs) == 2 and all(r.info.run_name == "train" and r.info.status == "FINISHED" for r in runs)
    accuracy = [m for r in runs for m in client.get_metric_history(r.info.run_id, "step/accuracy")]
    assert [m.step for m in accuracy] == [1, 2, 3]
    assert [m.value for m in accuracy] == pytest.approx([h["metrics"]["overall"] for h in history(grown_run)])
    assert runs[0].data.params["run.train.epochs"] == "1" and runs[0].data.params["run.method"] == "sb"
    assert runs[1].data.params["method"] == "sb"


def test_an_unknown_log_or_a_missing_extra_is_refused_before_any_work(color_data, tmp_path, monkeypatch):
    out = tmp_path / "never"
    res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--pretrained", "none", "--out", str(out), "--log", "wandb"])
    assert res.exit_code == 1 and "--log wandb is unknown" in res.stderr and not out.exists()
    monkeypatch.setattr("sbcli.watch.logs.importlib", SimpleNamespace(util=SimpleNamespace(find_spec=lambda name: None)))
    res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--pretrained", "none", "--out", str(out), "--log", "mlflow"])
    assert res.exit_code == 1 and 'pip install "sbcli[mlflow]"' in res.stderr and not out.exists()
