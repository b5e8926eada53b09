"""Nothing outside what sbcli wrote is ever deleted: folders that only look like a save's leftovers."""

import logging
import shutil
from pathlib import Path

import pytest
from test_learner import ZOO_V1, fake_step, tree
from test_store_cli import SMALL, invoke, refused

from sbcli.errors import LearnerError
from sbcli.learner.state import Learner
from sbcli.learner.store.lock import writer_lock
from sbcli.learner.store.outputs import check_output_dir


def add_step(target: Path) -> None:
    """What `sb add-task` does around its training: load, grow, save under the writer lock."""
    learner = Learner.load(target)
    fake_step(learner, 7.0)
    with writer_lock(target, "add-task"):
        learner.save(target)


@pytest.fixture
def learner(one_task_learner, tmp_path) -> Path:
    target = tmp_path / "L"
    shutil.copytree(one_task_learner, target)
    return target


def test_a_folder_named_like_an_old_save_but_holding_photos_is_left_and_named(learner, caplog):
    backup = learner.parent / ".L.old-backup"
    backup.mkdir()
    (backup / "photo.jpg").write_text("photo")
    with caplog.at_level(logging.INFO):
        add_step(learner)
    assert (backup / "photo.jpg").read_text() == "photo"
    assert "Removed .L.old-backup" not in caplog.text and ".L.old-backup" in caplog.text


def test_a_learner_copy_with_a_users_file_beside_it_is_not_a_leftover(learner, one_task_learner):
    tmp = learner.parent / ".L.tmp-mine"
    shutil.copytree(one_task_learner, tmp)
    (tmp / "notes.txt").write_text("mine")
    add_step(learner)
    assert (tmp / "notes.txt").read_text() == "mine"


def test_what_an_interrupted_save_of_0_1_left_is_still_removed(learner):
    shutil.copytree(ZOO_V1, learner.parent / ".L.old-4242")  # 0.1 wrote format 1 under these exact names
    shutil.copytree(ZOO_V1, learner.parent / ".L.tmp-k3_9xq0a")
    (learner.parent / ".L.tmp-zzzzzzzz").mkdir()  # cut short before its first file
    add_step(learner)
    assert sorted(p.name for p in learner.parent.iterdir()) == ["L"]


def test_add_task_never_deletes_a_users_learner_copy_named_like_an_old_save(learner, color_data, caplog):
    """A full learner copy the user named ``.L.old-copy`` (or ``.L.old-1234``, or a ``.L.tmp-*`` one,
    a learner of today's format: 0.1 never wrote those) survives `sb add-task` byte for byte."""
    copies = [learner.parent / name for name in (".L.old-copy", ".L.old-1234", ".L.tmp-abcdefgh", ".L.old-0042")]
    for copy in copies:
        shutil.copytree(learner, copy)
    v1_copy = learner.parent / ".L.old-007"  # a format-1 learner, but not a name 0.1 gave (a pid has no leading 0)
    shutil.copytree(ZOO_V1, v1_copy)
    before = {copy: tree(copy) for copy in [*copies, v1_copy]}
    with caplog.at_level(logging.INFO):
        res = invoke("add-task", learner, color_data["task2_train"], "--test", color_data["task2_test"], "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert {copy: tree(copy) for copy in before} == before
    assert "Removed" not in caplog.text and f"{learner.parent / '.L.old-copy'} beside L alone" in caplog.text


def test_a_users_copy_is_never_moved_into_a_missing_learners_place(tmp_path, one_task_learner):
    copy = tmp_path / ".L.old-copy"
    shutil.copytree(one_task_learner, copy)
    before = tree(copy)
    with pytest.raises(LearnerError, match="No learner"):
        Learner.load(tmp_path / "L")
    assert tree(copy) == before and not (tmp_path / "L").exists()


def test_a_users_step_named_folder_inside_a_learner_is_never_deleted(learner):
    photos = learner / "steps" / "2023"
    photos.mkdir()
    (photos / "photo.jpg").write_text("photo")
    add_step(learner)
    add_step(learner)  # the save after a rollback-free commit cleans unreferenced step folders
    assert (photos / "photo.jpg").read_text() == "photo"


def test_an_out_folder_holding_a_users_steps_folder_is_refused_untouched(tmp_path, color_data):
    out = tmp_path / "X"
    (out / "steps" / "2023").mkdir(parents=True)
    (out / "steps" / "2023" / "photo.jpg").write_text("photo")
    before = tree(out)
    with pytest.raises(LearnerError, match="not empty"):
        check_output_dir(out, option="--out")
    refused(invoke("train", color_data["task1_train"], "--out", out, "--method", "std", *SMALL), "not empty")
    assert tree(out) == before


def test_an_out_folder_holding_only_an_interrupted_first_save_is_taken(tmp_path, one_task_learner):
    out = tmp_path / "X"
    step = out / "steps" / "0001"
    step.mkdir(parents=True)
    shutil.copy(next(one_task_learner.glob("steps/*/model.safetensors")), step / "model.safetensors")
    (out / "learner.json.tmp-77").write_text("{half")
    check_output_dir(out, option="--out")  # accepted: nothing in it is anyone else's
