"""A learner is confined to its own directory: a symbolic link inside it is refused by every command.

A victim folder holding what looks like step folders (``2023/``, ``9999-1/``) sits behind a
``steps/`` link; every command that reads or writes learners is run on it, and the victim survives
byte for byte (a writer used to delete such folders as unreferenced steps).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from test_integrity import refused
from test_learner import ZOO_V1, tree
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.errors import LearnerError
from sbcli.learner.state import Learner

runner = CliRunner()


@pytest.fixture
def learner(one_task_learner: Path, tmp_path: Path) -> Path:
    target = tmp_path / "learner"
    shutil.copytree(one_task_learner, target)
    return target


def plant_victim(folder: Path) -> Path:
    """The user's own data, named like step folders."""
    for name in ("2023", "9999-1", "0001-7"):
        (folder / name).mkdir(parents=True)
        (folder / name / "notes.txt").write_text(f"my data in {name}")
    return folder


def every_command(learner: Path, color_data: dict[str, Path], tmp_path: Path) -> list[list[str]]:
    return [
        ["evaluate", str(learner), "--device", "cpu"],
        ["evaluate", str(learner), "--step", "1", "--device", "cpu", "--json"],
        ["add-task", str(learner), str(color_data["task2_train"]), "--test", str(color_data["task2_test"]),
         "--epochs", "1", "--device", "cpu"],
        ["rollback", str(learner), "1"],
        ["export", str(learner), "-o", str(tmp_path / "out.onnx")],
        ["predict", str(learner), str(color_data["task1_test"] / "red"), "--device", "cpu"],
        ["train", str(color_data["task1_train"]), "--pretrained", "none", "--test", str(color_data["task1_test"]), "--out", str(learner),
         "--resume", "--epochs", "1", "--width", "0.125", "--image-size", "16", "--device", "cpu"],
    ]


def test_a_steps_link_is_refused_and_the_folder_behind_it_survives_every_command(
        learner: Path, color_data, tmp_path: Path) -> None:
    victim = plant_victim(tmp_path / "victim")
    for entry in (learner / "steps").iterdir():
        shutil.move(entry, victim / entry.name)  # the learner's own steps live behind the link too
    (learner / "steps").rmdir()
    (learner / "steps").symlink_to(victim, target_is_directory=True)
    before = tree(victim)
    for args in every_command(learner, color_data, tmp_path):
        refused(args, learner, "symbolic link, steps")
        assert tree(victim) == before, args
    with pytest.raises(LearnerError, match="symbolic link"):
        Learner.load(learner.parent / "learner")
    assert tree(victim) == before and not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("rel", ["steps/0001/model.safetensors", "steps/0001", "learner.json", "history.csv"])
def test_any_link_inside_a_learner_is_refused(learner: Path, color_data, tmp_path: Path, rel: str) -> None:
    outside = tmp_path / "outside"
    shutil.move(learner / rel, outside)
    (learner / rel).symlink_to(outside)
    before = tree(outside) if outside.is_dir() else outside.read_bytes()
    for args in every_command(learner, color_data, tmp_path)[:4]:
        refused(args, learner, f"symbolic link, {rel}")
    assert (tree(outside) if outside.is_dir() else outside.read_bytes()) == before


def test_a_format_1_root_file_link_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "v1"
    shutil.copytree(ZOO_V1, copy)
    shutil.move(copy / "memory.safetensors", tmp_path / "memory.safetensors")
    (copy / "memory.safetensors").symlink_to(tmp_path / "memory.safetensors")
    refused(["evaluate", str(copy), "--device", "cpu"], copy, "symbolic link, memory.safetensors")


def test_the_learner_path_itself_may_be_a_link(learner: Path, tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(learner, target_is_directory=True)
    res = runner.invoke(app, ["evaluate", str(alias), "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    assert os.path.islink(alias)


def test_a_new_learner_never_deletes_through_a_leftover_steps_link(color_data, tmp_path: Path) -> None:
    victim = plant_victim(tmp_path / "victim")
    out = tmp_path / "new"
    out.mkdir()
    (out / "steps").symlink_to(victim, target_is_directory=True)  # looks like what an interrupted first save leaves
    before = tree(victim)
    refused(["train", str(color_data["task1_train"]), "--pretrained", "none", "--test", str(color_data["task1_test"]), "--out", str(out),
             "--epochs", "1", "--width", "0.125", "--image-size", "16", "--device", "cpu"], out, "symbolic link, steps")
    assert tree(victim) == before


def test_a_link_named_like_an_interrupted_save_is_never_followed(learner: Path, tmp_path: Path) -> None:
    victim = plant_victim(tmp_path / "victim")
    (learner.parent / f".{learner.name}.tmp-123").symlink_to(victim, target_is_directory=True)
    before = tree(victim)
    Learner.load(learner).save(learner)  # a save removes what interrupted saves of sbcli 0.1 left beside it
    assert tree(victim) == before and (learner.parent / f".{learner.name}.tmp-123").is_symlink()


def test_a_step_folder_that_vanishes_while_it_is_checked_is_not_an_error(tmp_path, monkeypatch):
    """A writer holding the lock may rename or remove a step folder while another command checks the
    learner (before that command asks for the lock): the check skips it, and the lock answers."""
    from sbcli.learner.store import layout

    root = tmp_path / "learner"
    (root / "steps" / "0001").mkdir(parents=True)
    (root / "steps" / "0002").mkdir()
    real = os.scandir

    def vanishing(path):
        if Path(path).name == "0002":
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real(path)

    monkeypatch.setattr(layout.os, "scandir", vanishing)
    assert layout.linked_entry(root) is None
