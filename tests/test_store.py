"""The commit point under a crash at every step of a save, the writer lock, rollback, leftovers."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import torch
from test_learner import ZOO_V1, fake_step, three_steps, tree

from sbcli import api
from sbcli.engine.loop import TrainConfig
from sbcli.errors import LearnerError
from sbcli.learner.state import Learner, kept_steps
from sbcli.learner.store import commit
from sbcli.learner.store.commit import FAULT_ENV, FAULT_EXIT
from sbcli.learner.store.layout import LOCK_INFO
from sbcli.learner.store.lock import writer_lock


class Crash(BaseException):
    """A simulated kill: no ``except Exception`` cleanup runs, as none would after SIGKILL."""


def crash_save(monkeypatch, learner, target, point: str, nth: int) -> None:
    """Save ``learner`` to ``target`` and crash at the ``nth`` time the save reaches ``point``."""
    hits = Counter()

    def crash(name):
        hits[name] += 1
        if name == point and hits[name] == nth:
            raise Crash(name)

    monkeypatch.setattr(commit, "checkpoint", crash)
    with pytest.raises(Crash):
        learner.save(target)
    monkeypatch.undo()


def marker(learner: Learner) -> float:
    return float(next(iter(learner.model.parameters())).detach().view(-1)[0])


@pytest.fixture
def base(one_task_learner) -> Path:
    return one_task_learner


BLOCK_POINTS = {"write:object", "fsync:object", "fsync:objects", "delete:leftover-object", "delete:dropped-object"}


def mark_blocks(learner: Learner, value: float) -> None:
    """Two tensors large enough to be stored as blocks: one the same at every step, one marking the step."""
    learner.extra["frozen"] = torch.arange(70_000, dtype=torch.float32)
    learner.extra["changing"] = torch.full((70_000,), value)


def two_steps(base: Path, target: Path, blocks: bool = False) -> Learner:
    """A learner with steps 1 and 2 (marked 1.0 and 2.0), keeping 2 steps, plus a crash's leftovers
    (with ``blocks``, tensors stored as blocks, one of them unchanged, and a leftover block)."""
    learner = Learner.load(base)
    with torch.no_grad():
        next(iter(learner.model.parameters())).view(-1)[0] = 1.0
    if blocks:
        mark_blocks(learner, 1.0)
    learner.save(target, keep=2)
    fake_step(learner, 2.0)
    if blocks:
        mark_blocks(learner, 2.0)
    learner.save(target)
    (target / "steps" / "0009").mkdir()  # an orphan step folder and a temporary of an interrupted save
    (target / "steps" / "0009" / "model.safetensors").write_bytes(b"half")
    (target / "learner.json.tmp-999999").write_text("{half")
    if blocks:  # a block an interrupted save wrote half of, under the name of the next step's
        (target / "objects" / hashlib.sha256(torch.full((70_000,), 3.0).numpy().tobytes()).hexdigest()).write_bytes(b"x")
    return learner


def next_step(learner: Learner, value: float, blocks: bool) -> None:
    fake_step(learner, value)
    if blocks:
        mark_blocks(learner, value)


def save_points(base: Path, tmp_path: Path, monkeypatch, blocks: bool = False) -> list[str]:
    """Every named point a save of step 3 passes, in order (with the leftovers to clean and a step to drop)."""
    learner = two_steps(base, tmp_path / "probe", blocks)
    next_step(learner, 3.0, blocks)
    seen: list[str] = []
    monkeypatch.setattr(commit, "checkpoint", seen.append)
    learner.save(tmp_path / "probe")
    monkeypatch.undo()
    return seen


def named_paths(stored: dict) -> set[str]:
    """Every file a learner.json names: the kept steps' files and their blocks."""
    return ({rel for files in stored["kept_steps"].values() for rel in files.values()}
            | {f"objects/{sha}" for blocks in stored.get("objects", {}).values() for sha in blocks})


@pytest.mark.parametrize("blocks", [False, True], ids=["inline", "blocks"])
def test_a_crash_at_every_point_of_a_save_leaves_a_complete_learner_old_or_new(base, tmp_path, monkeypatch, blocks):
    points = save_points(base, tmp_path, monkeypatch, blocks)
    assert {"write:model", "fsync:model", "write:memory", "fsync:memory", "write:state", "fsync:state",
            "fsync:step-dir", "fsync:steps", "write:learner.json.tmp", "fsync:learner.json.tmp",
            "rename:learner.json", "fsync:root", "delete:tmp", "delete:leftover-step", "delete:dropped-step"} <= set(points)
    assert (BLOCK_POINTS <= set(points)) if blocks else not BLOCK_POINTS & set(points)
    committed_at = points.index("rename:learner.json")
    occurrences = Counter()
    for i, point in enumerate(points):
        occurrences[point] += 1
        target = tmp_path / f"crash-{i}"
        learner = two_steps(base, target, blocks)
        next_step(learner, 3.0, blocks)
        crash_save(monkeypatch, learner, target, point, occurrences[point])
        after = Learner.load(target)  # a reader sees a complete learner at once
        expected = (3, 3.0) if i >= committed_at else (2, 2.0)
        assert (after.state.steps, marker(after)) == expected, point
        if blocks:
            assert float(after.extra["changing"][0]) == expected[1], point
        # the next writer cleans what the crash left and commits
        next_step(after, 4.0 if i >= committed_at else 3.0, blocks)
        after.save(target)
        stored = json.loads((target / "learner.json").read_text())
        assert set(tree(target)) == named_paths(stored) | {"learner.json"}, point
        assert len(stored["kept_steps"]) == 2
        if blocks:  # the unchanged tensor is one block named by both kept steps
            shared = set(stored["objects"][min(stored["objects"])]) & set(stored["objects"][max(stored["objects"])])
            assert len(shared) == 1, point
            for step in stored["kept_steps"]:
                Learner.load(target, step=int(step))  # every kept step reads, each block checked


@pytest.mark.parametrize("blocks", [False, True], ids=["inline", "blocks"])
def test_a_killed_process_at_a_fault_point_leaves_the_old_learner(base, tmp_path, blocks):
    target = tmp_path / "l"
    two_steps(base, target, blocks)
    before = json.loads((target / "learner.json").read_text())
    script = textwrap.dedent(f"""
        import torch
        from sbcli.learner.state import Learner
        from test_learner import fake_step
        from test_store import next_step
        learner = Learner.load({str(target)!r})
        next_step(learner, 3.0, {blocks!r})
        learner.save({str(target)!r})
    """)
    points = [("fsync:learner.json.tmp", 2), ("fsync:root", 3)]
    if blocks:
        points.insert(0, ("fsync:object", 2))
    for point, expected_steps in points:
        env = {**os.environ, FAULT_ENV: point, "PYTHONPATH": os.pathsep.join(sys.path)}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120, check=False)
        assert done.returncode == FAULT_EXIT, done.stderr[-2000:]
        after = Learner.load(target)
        assert after.state.steps == expected_steps
        if blocks:
            assert float(after.extra["changing"][0]) == expected_steps
    assert before["kept_steps"]["2"] == json.loads((target / "learner.json").read_text())["kept_steps"]["2"]


def test_a_second_writer_is_refused_at_once_naming_the_holder(base, tmp_path):
    target = tmp_path / "l"
    Learner.load(base).save(target)
    with writer_lock(target, "add-task"):
        note = json.loads((target / LOCK_INFO).read_text())
        assert note["pid"] == os.getpid() and note["host"] == socket.gethostname() and note["command"] == "add-task"
        with pytest.raises(LearnerError, match=rf"being written by sb add-task \(pid {os.getpid()} on .*, since "):
            with writer_lock(target, "rollback"):
                pass
    with writer_lock(target, "rollback"):  # released: the next writer gets it
        pass
    assert not (target / LOCK_INFO).exists()


def test_the_lock_of_a_killed_writer_is_taken_over(base, tmp_path):
    target = tmp_path / "l"
    Learner.load(base).save(target)
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from sbcli.learner.store.lock import writer_lock
        with writer_lock(Path({str(target)!r}), "add-task"):
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=60, check=False)
    assert done.returncode == -signal.SIGKILL
    assert json.loads((target / LOCK_INFO).read_text())["pid"] != os.getpid()  # the dead holder's note is left
    with writer_lock(target, "train"):
        assert json.loads((target / LOCK_INFO).read_text())["pid"] == os.getpid()


def test_rollback_makes_a_kept_step_current_and_the_next_save_replaces_later_steps(base, tmp_path):
    target = tmp_path / "l"
    three_steps(base, target)
    result = api.rollback(target, 2)
    assert result["step"] == 2 and result["previous"] == 3 and result["kept_steps"] == [1, 2, 3]
    now = Learner.load(target)
    assert now.state.steps == 2 and marker(now) == 2.0
    assert marker(Learner.load(target, step=3)) == 3.0  # the later step is still there
    api.rollback(target, 3)
    assert Learner.load(target).state.steps == 3
    api.rollback(target, 2)
    again = Learner.load(target)
    fake_step(again, 33.0)
    again.save(target)  # a new step 3 replaces the old one
    assert kept_steps(target) == [1, 2, 3] and marker(Learner.load(target)) == 33.0
    assert sorted(p.name for p in (target / "steps").iterdir()) == ["0001", "0002", "0003-1"]


def test_rollback_to_a_step_not_kept_changes_nothing(base, tmp_path):
    target = tmp_path / "l"
    learner = Learner.load(base)
    learner.save(target)
    fake_step(learner, 2.0)
    learner.save(target)
    before = tree(target)
    for step in (0, 3, 99):
        with pytest.raises(LearnerError, match=rf"Step {step} .* not kept \(kept steps: 1, 2\)"):
            api.rollback(target, step)
    assert tree(target) == before


def test_a_learner_left_between_the_renames_of_the_old_save_is_recovered(tmp_path, caplog):
    import shutil

    shutil.copytree(ZOO_V1, tmp_path / ".l.old-4242")
    shutil.copytree(ZOO_V1, tmp_path / ".l.tmp-abcd1234")
    (tmp_path / ".l.tmp-zzzzzzzz").mkdir()  # an incomplete one is never chosen
    learner = Learner.load(tmp_path / "l")
    assert learner.state.steps == 2 and "Recovered the learner" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == [".l.old-4242", ".l.tmp-zzzzzzzz", "l"]
    fake_step(learner, 1.0)
    with writer_lock(tmp_path / "l", "add-task"):
        learner.save(tmp_path / "l")  # a writer removes the rest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l"]


def test_a_writer_looks_for_an_old_saves_leftovers_once(tmp_path, monkeypatch):
    import shutil

    from sbcli.learner.store import legacy

    shutil.copytree(ZOO_V1, tmp_path / ".l.old-4242")  # the learner, left beside its folder by a 0.1 save
    shutil.copytree(ZOO_V1, tmp_path / ".l.tmp-abcd1234")
    calls, real = [], legacy.recover
    monkeypatch.setattr(legacy, "recover", lambda *a, **k: calls.append(k) or real(*a, **k))
    assert api.rollback(tmp_path / "l", 2)["kept_steps"] == [2]
    assert calls == [{"writer": True}]  # in the lock; the load under it does not look again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l"]  # the newest put back, the other removed


def test_a_failed_first_train_leaves_no_directory(tmp_path, color_data):
    run = api.RunOptions(method="std", width=0.125, train=TrainConfig(epochs=1, batch_size=16), memory=8, device="cpu")
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), image_size=16, tasks=5)  # 2 classes in 5 tasks
    with pytest.raises(Exception, match="task"):
        api.train(seq, run, tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_a_reader_whose_files_a_writer_deleted_reads_learner_json_again(base, tmp_path, monkeypatch):
    from sbcli.learner.store import layout

    target = tmp_path / "l"
    learner = Learner.load(base)
    learner.save(target)
    stale = layout.read_stored(target)  # the reader has read learner.json ...
    fake_step(learner, 2.0)
    learner.save(target, keep=1)  # ... then a writer commits step 2 and deletes step 1
    assert not (target / "steps" / "0001").exists()
    calls = iter([stale])
    real = layout.read_stored
    monkeypatch.setattr(layout, "read_stored", lambda path: next(calls, None) or real(path))
    again = Learner.load(target)
    assert again.state.steps == 2 and marker(again) == 2.0


def test_a_file_missing_without_a_commit_is_named_once(base, tmp_path):
    target = tmp_path / "l"
    Learner.load(base).save(target)
    memory = next((target / "steps").glob("*/memory.safetensors"))
    memory.unlink()
    with pytest.raises(LearnerError, match=r"is missing steps/\d+/memory.safetensors; restore"):
        Learner.load(target)


def test_a_crash_at_every_point_of_the_first_save_of_a_format_1_learner(tmp_path, monkeypatch):
    import shutil

    probe = tmp_path / "probe"
    shutil.copytree(ZOO_V1, probe)
    learner = Learner.load(probe)
    fake_step(learner, 3.0)
    seen: list[str] = []
    monkeypatch.setattr(commit, "checkpoint", seen.append)
    learner.save(probe)
    monkeypatch.undo()
    assert "delete:v1" in seen
    committed_at, occurrences = seen.index("rename:learner.json"), Counter()
    for i, point in enumerate(seen):
        occurrences[point] += 1
        target = tmp_path / f"v1-{i}"
        shutil.copytree(ZOO_V1, target)
        crash_save(monkeypatch, learner, target, point, occurrences[point])
        after = Learner.load(target)
        assert after.state.steps == (3 if i >= committed_at else 2), point
        assert sorted(kept_steps(target)) == ([2, 3] if i >= committed_at else [2]), point


def test_a_directory_that_cannot_be_locked_or_written_is_one_sentence(base, tmp_path, monkeypatch):
    import filelock

    from sbcli.learner.store import lock as lock_module

    target = tmp_path / "l"
    Learner.load(base).save(target)

    def read_only(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(target / ".sbcli.lock"))

    monkeypatch.setattr(filelock.FileLock, "acquire", read_only)
    with pytest.raises(LearnerError, match="Cannot lock the learner .* writable"):
        with writer_lock(target, "add-task"):
            pass
    monkeypatch.undo()

    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lock_module.Path, "write_text", full)
    with pytest.raises(LearnerError, match="No space left on device"):
        with writer_lock(target, "add-task"):
            pass


def test_a_full_disk_during_the_save_is_one_sentence_and_the_learner_stays(base, tmp_path, monkeypatch):
    target = tmp_path / "l"
    learner = Learner.load(base)
    learner.save(target)
    before = tree(target)

    def full(path):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(commit, "fsync_file", full)
    fake_step(learner, 2.0)
    with pytest.raises(LearnerError, match="No space left on device.*unchanged"):
        learner.save(target)
    monkeypatch.undo()
    assert {k: v for k, v in tree(target).items() if k in before} == before
    assert Learner.load(target).state.steps == 1
