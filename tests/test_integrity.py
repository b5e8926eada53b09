"""A learner vouches for its own bytes: learner.json records every named file's SHA-256 and size.

Every damage here passes the structural checks (it is valid safetensors of the right shapes, or a
step copied whole from a learner of the same classes) and is caught by the recorded hashes alone:
refused in one sentence naming the file, the learner's bytes unchanged. Older learners without
hashes still load, and their next save records them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import huggingface_hub as hf
import pytest
from fake_hub import FakeHub
from learner_files import read_raw
from test_learner import ZOO_V1, fake_step, tree
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.errors import LearnerError
from sbcli.learner.state import Learner

runner = CliRunner()


def on_disk(learner: Path) -> dict:
    return json.loads((learner / "learner.json").read_text())


def assert_hashes_match_disk(learner: Path) -> None:
    state = on_disk(learner)
    named = {rel for files in state["kept_steps"].values() for rel in files.values()}
    named |= {f"objects/{sha}" for shas in state.get("objects", {}).values() for sha in shas}  # format 4's blocks
    assert set(state["hashes"]) == named
    for rel, record in state["hashes"].items():
        raw = (learner / rel).read_bytes()
        assert record == {"sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw)}, rel


def refused(args: list[str], learner: Path, *words: str) -> str:
    """Run ``sb ARGS``: exit 1, one sentence holding ``words``, the learner's bytes unchanged."""
    before = tree(learner)
    res = runner.invoke(app, args)
    lines = [line for line in res.stderr.strip().splitlines() if line.startswith("Error:")]  # after any progress note
    assert res.exit_code == 1 and len(lines) == 1 and res.stderr.strip().endswith(lines[0]), (args, res.output)
    assert "Unexpected error" not in res.stderr and "Traceback" not in res.output
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert tree(learner) == before
    return lines[0]


def flip_data_bit(path: Path, at: float = 0.5) -> None:
    """Flip one bit inside the tensor data (not the header): the file stays valid safetensors."""
    header, data = read_raw(path)
    raw = bytearray(path.read_bytes())
    start = len(raw) - len(data)
    raw[start + min(int(at * len(data)), len(data) - 1)] ^= 0x04
    path.write_bytes(bytes(raw))


def zero_tail(path: Path, n: int = 64) -> None:
    raw = bytearray(path.read_bytes())
    raw[-n:] = bytes(n)
    path.write_bytes(bytes(raw))


@pytest.fixture
def two_steps(one_task_learner: Path, tmp_path: Path) -> Path:
    """A learner of two steps (the second one fake, marked 2.0), format 3."""
    learner = Learner.load(one_task_learner)
    target = tmp_path / "a"
    learner.save(target)
    fake_step(learner, 2.0)
    learner.save(target)
    return target


def test_every_save_records_every_named_file(two_steps: Path, tmp_path: Path) -> None:
    assert_hashes_match_disk(two_steps)
    api.rollback(two_steps, 1)
    assert_hashes_match_disk(two_steps)
    Learner.load(two_steps).publish(tmp_path / "flat")
    assert_hashes_match_disk(tmp_path / "flat")


def test_a_step_copied_from_another_learner_is_refused(two_steps: Path, one_task_learner: Path, tmp_path: Path) -> None:
    # another learner with the same classes and the same second step, but other weights: structurally identical
    other = Learner.load(one_task_learner)
    fake_step(other, 7.0)
    other.save(tmp_path / "b")
    for name in ("model.safetensors", "memory.safetensors", "state.json", "test-sample.safetensors"):
        shutil.copyfile(tmp_path / "b" / "steps/0002" / name, two_steps / "steps/0002" / name)
    refused(["evaluate", str(two_steps), "--device", "cpu"], two_steps, "steps/0002/model.safetensors",
            "not the file learner.json recorded")
    assert api.rollback(two_steps, 1)["step"] == 1  # step 1 is intact: going back to it works


@pytest.mark.parametrize(("name", "damage"), [
    ("model.safetensors", lambda p: flip_data_bit(p, 0.9)),
    ("model.safetensors", zero_tail),
    ("model.safetensors", lambda p: p.write_bytes(p.read_bytes()[:-4])),
    ("memory.safetensors", lambda p: flip_data_bit(p, 0.5)),
    ("test-sample.safetensors", lambda p: flip_data_bit(p, 0.3)),
    ("test-sample.safetensors", lambda p: zero_tail(p, 16)),
])
def test_flipped_bits_and_damaged_tails_are_refused(two_steps: Path, name: str, damage) -> None:
    damage(two_steps / "steps/0002" / name)
    refused(["evaluate", str(two_steps), "--device", "cpu"], two_steps, f"steps/0002/{name}")
    refused(["export", str(two_steps), "-o", str(two_steps.parent / "m.onnx")], two_steps, f"steps/0002/{name}")
    assert not (two_steps.parent / "m.onnx").exists()


def test_an_earlier_step_is_checked_before_going_back_to_it(two_steps: Path) -> None:
    state = two_steps / "steps/0001/state.json"
    state.write_text(state.read_text().replace('"seed"', '"seed" ', 1))  # still valid JSON, other bytes
    refused(["rollback", str(two_steps), "1"], two_steps, "steps/0001/state.json")
    refused(["evaluate", str(two_steps), "--step", "1", "--device", "cpu"], two_steps, "steps/0001/state.json")
    flip_data_bit(two_steps / "steps/0001/model.safetensors")
    assert Learner.load(two_steps).state.steps == 2  # the current step does not read step 1


def test_the_size_is_checked_before_the_file_is_read(two_steps: Path) -> None:
    model = two_steps / "steps/0002/model.safetensors"
    with open(model, "r+b") as f:
        f.truncate(1 << 31)  # 2 GiB, sparse: refused from its size alone
    line = refused(["evaluate", str(two_steps), "--device", "cpu"], two_steps, "steps/0002/model.safetensors")
    assert str(1 << 31) in line


def test_a_format_3_learner_without_hashes_is_refused(two_steps: Path) -> None:
    state = on_disk(two_steps)
    del state["hashes"]["steps/0002/memory.safetensors"]
    (two_steps / "learner.json").write_text(json.dumps(state))
    refused(["evaluate", str(two_steps), "--device", "cpu"], two_steps, "no hash of steps/0002/memory.safetensors")


def test_older_learners_without_hashes_load_and_their_next_save_records_them(two_steps: Path, tmp_path: Path) -> None:
    state = on_disk(two_steps)
    del state["hashes"]
    state["format_version"] = 2
    (two_steps / "learner.json").write_text(json.dumps(state, indent=2))
    res = runner.invoke(app, ["evaluate", str(two_steps), "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    learner = Learner.load(two_steps)
    fake_step(learner, 3.0)
    learner.save(two_steps)
    assert on_disk(two_steps)["format_version"] == 4
    assert_hashes_match_disk(two_steps)  # steps 1 and 2 hashed from disk, step 3 from the bytes written
    # format 1 (the bundled zoo learner): read as is, the next save records every file
    copy = tmp_path / "v1"
    shutil.copytree(ZOO_V1, copy)
    grown = Learner.load(copy)
    fake_step(grown, 9.0)
    grown.save(copy)
    assert_hashes_match_disk(copy)


def publish_to_hub(learner: Path, folder: Path, repo: str, damage=None) -> None:
    Learner.load(learner).publish(folder)
    if damage is not None:
        damage(folder)
    hf.HfApi().create_repo(repo)
    for path in sorted(folder.iterdir()):
        hf.HfApi().upload_file(path_or_fileobj=str(path), path_in_repo=path.name, repo_id=repo)


@pytest.mark.parametrize(("damage", "named"), [
    (lambda f: flip_data_bit(f / "model.safetensors", 0.7), "model.safetensors"),
    (lambda f: zero_tail(f / "memory.safetensors"), "memory.safetensors"),
    (lambda f: zero_tail(f / "test-sample.safetensors", 8), "test-sample.safetensors"),
])
def test_a_damaged_learner_from_a_repository_outside_the_zoo_is_not_installed(
        fake_hub: FakeHub, one_task_learner: Path, tmp_path: Path, damage, named: str) -> None:
    publish_to_hub(one_task_learner, tmp_path / "flat", "tester/damaged", damage)
    with pytest.raises(LearnerError, match=f"{named} is not the file learner.json recorded"):
        api.pull("tester/damaged", tmp_path / "pulled")
    assert not (tmp_path / "pulled").exists() and [p.name for p in tmp_path.iterdir()] == ["flat", "hf_home"]


def test_an_intact_learner_from_outside_the_zoo_is_verified_and_installed(
        fake_hub: FakeHub, one_task_learner: Path, tmp_path: Path) -> None:
    publish_to_hub(one_task_learner, tmp_path / "flat", "tester/intact")
    report = api.pull("tester/intact", tmp_path / "pulled")
    assert report.contents["steps"] == 1
    assert_hashes_match_disk(tmp_path / "pulled")
