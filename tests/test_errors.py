"""No traceback reaches the user: every failure is one sentence and a non-zero exit."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import typer
from learner_files import hashes, rehash
from safetensors import SafetensorError
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli._errors import describe, friendly_errors
from sbcli.cli.app import app
from sbcli.data.sources import load_folder
from sbcli.engine.loop import Engine, Phase, TrainConfig
from sbcli.errors import ConfigError, DataError, LearnerError, TrainingError

runner = CliRunner()
SMALL = ["--pretrained", "none", "--width", "0.125", "--epochs", "1", "--batch-size", "16", "--memory", "8", "--device", "cpu", "--image-size", "16"]


@pytest.mark.parametrize(("err", "words"), [
    (OSError(errno.ENOSPC, "No space left on device", "/l/model.safetensors"), "/l/model.safetensors: the disk is full"),
    (PermissionError(errno.EACCES, "Permission denied", "/l"), "/l: permission denied"),
    (OSError(errno.EROFS, "Read-only file system", "/l"), "read-only"),
    (OSError(errno.ELOOP, "Too many levels of symbolic links", "/d/x"), "/d/x: a symlink loop"),
    (MemoryError(), "Out of memory"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "UTF-8"),
    (json.JSONDecodeError("Expecting value", "x", 0), "should be JSON"),
    (type("SafetensorError", (Exception,), {})("header too large"), "safetensors file could not be read or written"),
    (KeyError("images"), "Unexpected error (KeyError"),
])
def test_every_failure_is_described_in_one_line(err, words):
    text = describe(err)
    assert words in text and "\n" not in text


def _raising(err: BaseException):
    @friendly_errors
    def command() -> None:
        raise err
    return command


@pytest.mark.parametrize("err", [LearnerError("bad learner."), OSError(errno.ENOSPC, "full", "/x"), ValueError("boom"),
                                 MemoryError()])
def test_the_boundary_exits_1_and_keeps_the_traceback_only_with_sbcli_debug(err, monkeypatch):
    monkeypatch.delenv("SBCLI_DEBUG", raising=False)
    with pytest.raises(typer.Exit) as exit_:
        _raising(err)()
    assert exit_.value.exit_code == 1
    monkeypatch.setenv("SBCLI_DEBUG", "1")
    with pytest.raises(type(err)):
        _raising(err)()


def test_typer_s_own_exits_pass_through(monkeypatch):
    monkeypatch.delenv("SBCLI_DEBUG", raising=False)
    with pytest.raises(typer.BadParameter):
        _raising(typer.BadParameter("bad"))()
    with pytest.raises(typer.Exit):
        _raising(typer.Exit(0))()


def test_the_real_entry_point_prints_one_line_and_sbcli_debug_the_traceback(tmp_path):
    learner = tmp_path / "l"
    learner.mkdir()
    for name in ("model.safetensors", "memory.safetensors"):
        (learner / name).write_bytes(b"")
    (learner / "learner.json").write_text("[1, 2]")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("SBCLI_DEBUG", None)
    cmd = [sys.executable, "-m", "sbcli", "evaluate", str(learner), "--device", "cpu"]
    res = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.strip().startswith("Error:") and "not a JSON object" in res.stderr
    debug = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**env, "SBCLI_DEBUG": "1"})
    assert debug.returncode != 0 and "Traceback" in debug.stderr


# -- refused before any work ------------------------------------------------------------------


def test_tasks_0_is_refused(color_data, tmp_path):
    res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--out", str(tmp_path / "o"), "--tasks", "0", *SMALL])
    assert res.exit_code == 1 and "--tasks 0 is not a count" in res.stderr, res.output
    assert not (tmp_path / "o").exists()


def test_a_width_a_learner_could_not_be_loaded_with_is_refused(color_data, tmp_path):
    res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--out", str(tmp_path / "o"), *SMALL, "--width", "64"])
    assert res.exit_code == 1 and "--width must be above 0 and at most 4.0" in res.stderr, res.output


def test_symlink_loops_and_dangling_links_are_named_in_one_sentence(color_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(color_data["task1_train"], data)
    (data / "red" / "loop").symlink_to("..")
    with pytest.raises(DataError, match=r"red/loop is a symlink loop"):
        load_folder(data, 16, cache=None)
    (data / "red" / "loop").unlink()
    (data / "green" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    with pytest.raises(DataError, match=r"green/gone.jpg is a symlink to .*nowhere.jpg, which does not exist"):
        load_folder(data, 16, cache=None)
    res = runner.invoke(app, ["train", str(data), "--out", str(tmp_path / "o"), *SMALL])
    assert res.exit_code == 1 and "gone.jpg" in res.stderr and "Traceback" not in res.output


# -- the learner's directory: checked before training, errors at save time --------------------


@pytest.fixture(scope="module")
def tiny(one_task_learner) -> Path:
    """The session's trained one-task learner (conftest.py): each test works on a copy."""
    torch.set_num_threads(1)
    return one_task_learner


def _copy(tiny: Path, tmp_path: Path) -> Path:
    shutil.copytree(tiny, tmp_path / "l")
    return tmp_path / "l"


def test_an_unwritable_learner_directory_is_refused_before_training(tiny, color_data, tmp_path, monkeypatch):
    learner = _copy(tiny, tmp_path)
    before = hashes(learner)

    def denied(*args, **kwargs):  # the writer lock's file is the first thing add-task writes
        raise PermissionError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("filelock.FileLock.acquire", denied)
    progress = []
    with pytest.raises(LearnerError, match="Cannot lock the learner .*Read-only file system.* writable"):
        api.add_task(learner, color_data["task2_train"], color_data["task2_test"], device="cpu", on_progress=progress.append)
    assert progress == [] and hashes(learner) == before


def test_a_disk_too_full_for_the_save_is_refused_before_training(tiny, color_data, tmp_path, monkeypatch):
    learner = _copy(tiny, tmp_path)
    before = hashes(learner)
    monkeypatch.setattr("sbcli.learner.preflight.shutil.disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 4096, 4096))
    progress = []
    with pytest.raises(LearnerError, match="Not enough free space .* 0.0 MiB free"):
        api.add_task(learner, color_data["task2_train"], color_data["task2_test"], device="cpu", on_progress=progress.append)
    assert progress == [] and hashes(learner) == before
    res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--out", str(tmp_path / "new"), *SMALL])
    assert res.exit_code == 1 and "Not enough free space" in res.stderr and not (tmp_path / "new").exists()


@pytest.mark.parametrize("failure", [
    OSError(errno.ENOSPC, "No space left on device", "model.safetensors"),
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),  # as safetensors says it
])
def test_a_failure_while_saving_is_one_sentence_and_the_learner_is_unchanged(tiny, color_data, tmp_path, monkeypatch,
                                                                             failure):
    learner = _copy(tiny, tmp_path)
    before = hashes(learner)

    def full(*args, **kwargs):
        raise failure

    monkeypatch.setattr("sbcli.learner.state.commit_step", full)
    res = runner.invoke(app, ["add-task", str(learner), str(color_data["task2_train"]), "--device", "cpu", "--epochs", "1"])
    assert res.exit_code == 1, res.output
    text = " ".join(res.stderr.split())
    assert "Could not save the learner" in text and "No space left on device" in text and "unchanged" in text
    assert hashes(learner) == before


# -- a loss that is not finite stops training at once ----------------------------------------


def test_a_non_finite_loss_stops_the_phase_at_its_first_epoch():
    torch.manual_seed(0)
    from sbcli.data.device import DeviceData, Normalization
    from sbcli.nets import create_model

    data = DeviceData(torch.randint(0, 256, (32, 3, 16, 16), dtype=torch.uint8), torch.arange(32) % 4)
    events = []
    engine = Engine(TrainConfig(epochs=3, batch_size=16, precision="fp32"), torch.device("cpu"), Normalization(), seed=0,
                    on_progress=events.append)
    phase = Phase("base", lambda o: o.logits.sum() * float("nan"), 3)
    with pytest.raises(TrainingError, match="Training diverged: the loss became nan in epoch 1 of phase base"):
        engine.run(create_model("resnet18", 4, 0.125), data, phase)
    assert events == []  # stopped before the epoch was reported, and no later epoch ran


def test_a_diverging_add_task_leaves_the_learner_as_it_was(tiny, color_data, tmp_path):
    learner = _copy(tiny, tmp_path)
    state = json.loads((learner / "learner.json").read_text())
    state["train_config"]["lr"] = 1e6  # valid JSON, but the step diverges
    (learner / "learner.json").write_text(json.dumps(state))
    rehash(learner)  # saved so (by a learner that trains at that rate): its step's record says the same
    before = hashes(learner)
    res = runner.invoke(app, ["add-task", str(learner), str(color_data["task2_train"]), "--device", "cpu", "--epochs", "2"])
    assert res.exit_code == 1 and "Training diverged" in res.stderr, res.output
    assert hashes(learner) == before


def test_config_errors_are_still_sbcli_errors():
    assert issubclass(TrainingError, Exception) and not issubclass(TrainingError, ConfigError)


def test_ctrl_c_is_one_word_and_exit_130(monkeypatch):
    monkeypatch.delenv("SBCLI_DEBUG", raising=False)
    with pytest.raises(typer.Exit) as exit_:
        _raising(KeyboardInterrupt())()
    assert exit_.value.exit_code == 130
