"""The learner on disk: format 2 round trip, format 1 still read, kept steps, file modes."""

import dataclasses
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from sbcli.errors import LearnerError
from sbcli.learner.state import Learner, kept_steps, read_state
from sbcli.learner.store.layout import FORMAT_VERSION

ZOO_V1 = Path(__file__).resolve().parents[1] / "zoo" / "learners" / "demo-sb-tiny"


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path -> SHA-256), the lock files aside; read in chunks, so that
    a huge (sparse) file planted by a test costs no memory."""
    return {p.relative_to(folder).as_posix(): file_sha256(p)
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(".sbcli.lock")}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fake_step(learner: Learner, value: float) -> None:
    """Record one more step without training: one new class, and one weight marks the step."""
    state, step = learner.state, learner.state.steps
    name = f"fake-{step + 1}-{len(state.class_names)}"
    state.class_names.append(name)
    state.class_task.append(step)
    state.tasks.append(dataclasses.replace(state.tasks[-1], classes=[name]))
    state.history.append(dataclasses.replace(state.history[-1], step=step + 1, num_classes=len(state.class_names)))
    learner.model.expand_classes(1)
    with torch.no_grad():
        next(iter(learner.model.parameters())).view(-1)[0] = value


@pytest.fixture
def learner_dir(one_task_learner) -> Path:
    return one_task_learner


def three_steps(source: Path, target: Path) -> Learner:
    """``source``'s learner saved at ``target``, then two more steps marked 2.0 and 3.0; the last one."""
    learner = Learner.load(source)
    learner.save(target)
    for value in (2.0, 3.0):
        fake_step(learner, value)
        learner.save(target)
    return learner


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
    assert sorted(tree(copy)) == ["learner.json", "steps/0001/memory.safetensors", "steps/0001/model.safetensors",
                                  "steps/0001/state.json", "steps/0001/test-sample.safetensors"]
    assert torch.equal(again.test_sample.images, learner.test_sample.images)


def test_learner_json_records_what_the_design_asks(learner_dir):
    state = json.loads((learner_dir / "learner.json").read_text())
    assert state["format_version"] == FORMAT_VERSION == 4 and state["arch"] == "resnet18" and state["image_size"] == 16
    assert sorted(state["class_names"]) == ["green", "red"]
    assert state["class_task"] == [0, 0]
    assert set(state["normalization"]) == {"mean", "std"}
    assert state["history"][0]["metrics"]["overall"] >= 0
    assert {"sbcli_version", "torch_version", "dataset"} <= set(state["provenance"])
    assert state["files"] == state["kept_steps"]["1"] == {
        "model": "steps/0001/model.safetensors", "memory": "steps/0001/memory.safetensors", "state": "steps/0001/state.json",
        "test_sample": "steps/0001/test-sample.safetensors"}
    step_state = json.loads((learner_dir / "steps/0001/state.json").read_text())
    assert step_state == {k: v for k, v in state.items() if k not in ("files", "kept_steps", "keep", "hashes", "objects")}
    # every named file is recorded with its SHA-256 and size, as it is on disk
    assert set(state["hashes"]) == set(state["files"].values())
    for rel, record in state["hashes"].items():
        raw = (learner_dir / rel).read_bytes()
        assert record == {"sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw)}


def test_files_and_folders_follow_the_umask(learner_dir, tmp_path):
    old = os.umask(0o022)
    try:
        Learner.load(learner_dir).save(tmp_path / "l")
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [tmp_path / "l", *(tmp_path / "l").rglob("*")]}
    assert modes["l"] == modes["l/steps"] == modes["l/steps/0001"] == 0o755
    assert modes["l/learner.json"] == modes["l/steps/0001/model.safetensors"] == 0o644


def test_every_step_is_kept_and_readable_until_keep_limits_them(learner_dir, tmp_path):
    target = tmp_path / "l"
    learner = three_steps(learner_dir, target)
    assert kept_steps(target) == [1, 2, 3]
    assert Learner.load(target, step=2).state.steps == 2
    assert next(iter(Learner.load(target, step=2).model.parameters())).view(-1)[0] == 2.0
    assert next(iter(Learner.load(target).model.parameters())).view(-1)[0] == 3.0
    fake_step(learner, 4.0)
    learner.save(target, keep=2)
    assert kept_steps(target) == [3, 4] and sorted(p.name for p in (target / "steps").iterdir()) == ["0003", "0004"]
    fake_step(learner, 5.0)
    learner.save(target)  # the stored keep applies to later saves
    assert kept_steps(target) == [4, 5]


def test_a_step_that_is_not_kept_is_refused_in_one_sentence(learner_dir):
    with pytest.raises(LearnerError, match=r"Step 7 .* not kept \(kept steps: 1\)"):
        Learner.load(learner_dir, step=7)
    with pytest.raises(LearnerError, match="not kept"):
        read_state(learner_dir, step=0)


def test_format_1_is_read_and_the_next_save_writes_format_2_keeping_its_step(tmp_path):
    before = tree(ZOO_V1)
    v1 = Learner.load(ZOO_V1)
    assert v1.state.format_version == 1 and v1.state.steps == 2 and kept_steps(ZOO_V1) == [2]
    assert tree(ZOO_V1) == before  # reading never rewrites the bundled fixture
    copy = tmp_path / "v1"
    shutil.copytree(ZOO_V1, copy)
    grown = Learner.load(copy)
    fake_step(grown, 9.0)
    grown.save(copy)
    stored = json.loads((copy / "learner.json").read_text())
    assert stored["format_version"] == 4 and sorted(stored["kept_steps"]) == ["2", "3"]
    assert not (copy / "model.safetensors").exists() and not (copy / "memory.safetensors").exists()
    old = Learner.load(copy, step=2)
    for key, value in v1.model.state_dict().items():
        assert torch.equal(value, old.model.state_dict()[key]), key
    assert torch.equal(old.memory.images, v1.memory.images)


def test_newer_format_and_missing_files_are_refused(learner_dir, tmp_path):
    newer = tmp_path / "newer"
    shutil.copytree(learner_dir, newer)
    state = json.loads((newer / "learner.json").read_text())
    state["format_version"] = 99
    (newer / "learner.json").write_text(json.dumps(state))
    with pytest.raises(LearnerError, match="newer"):
        Learner.load(newer)
    missing = tmp_path / "missing"
    shutil.copytree(learner_dir, missing)
    (missing / "steps/0001/memory.safetensors").unlink()
    with pytest.raises(LearnerError, match="missing steps/0001/memory.safetensors"):
        Learner.load(missing)
    with pytest.raises(LearnerError, match="missing steps/0001/memory.safetensors"):
        read_state(missing)


@pytest.mark.parametrize("files", [{"model": "../../etc/passwd"}, {"model": "/abs/model.safetensors"}, "steps/0001", None])
def test_file_names_outside_steps_are_refused(learner_dir, tmp_path, files):
    bad = tmp_path / "bad"
    shutil.copytree(learner_dir, bad)
    state = json.loads((bad / "learner.json").read_text())
    if isinstance(files, dict):
        state["files"] = state["kept_steps"]["1"] = {**state["files"], **files}
    else:
        state["files"] = files
    (bad / "learner.json").write_text(json.dumps(state))
    with pytest.raises(LearnerError, match="learner.json"):
        Learner.load(bad)
