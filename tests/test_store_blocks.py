"""Format 4: what did not change between steps is stored once, as content-addressed blocks.

Unchanged tensors (a frozen backbone, a projection) are one block named by every step; a tensor that
grows at its end (the carried test sample) re-stores only its last block; ``--keep`` frees the blocks no
kept step names; rollback reads any kept step; every block is checked against its name at load and at
pull; a format-3 learner is still read and grows into format 4; a push is whole files.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from test_learner import fake_step, tree

from sbcli import api
from sbcli.errors import ExportError, LearnerError
from sbcli.learner.state import Learner
from sbcli.learner.store import objects
from sbcli.learner.test_sample import CarriedSample, joined


def mark(learner: Learner, value: float) -> None:
    """A tensor the same at every step (stored as one block) and one that marks the step."""
    learner.extra["frozen"] = torch.arange(70_000, dtype=torch.float32)
    learner.extra["changing"] = torch.full((70_000,), value)


def on_disk(learner: Path) -> dict:
    return json.loads((learner / "learner.json").read_text())


def blocks_of(learner: Path) -> set[str]:
    folder = learner / "objects"
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def grow(source: Path, target: Path, steps: int, keep: int | None = None) -> Learner:
    learner = Learner.load(source)
    mark(learner, 1.0)
    learner.save(target, keep=keep)
    for value in range(2, steps + 1):
        fake_step(learner, float(value))
        mark(learner, float(value))
        learner.save(target)
    return learner


def test_an_unchanged_tensor_is_stored_once_and_every_step_reads_back(one_task_learner, tmp_path):
    target = tmp_path / "l"
    grow(one_task_learner, target, 3)
    stored = on_disk(target)
    assert stored["format_version"] == 4
    per_step = {int(n): set(shas) for n, shas in stored["objects"].items()}
    shared = per_step[1] & per_step[2] & per_step[3]
    assert len(shared) == 1 and all(len(s) == 2 for s in per_step.values())
    assert blocks_of(target) == set().union(*per_step.values())  # 1 shared + 3 changing blocks, nothing else
    assert len(blocks_of(target)) == 4
    for step in (1, 2, 3):
        learner = Learner.load(target, step=step)
        assert float(learner.extra["changing"][0]) == step
        assert torch.equal(learner.extra["frozen"], torch.arange(70_000, dtype=torch.float32))
    api.rollback(target, 1)
    assert float(Learner.load(target).extra["changing"][0]) == 1.0 and len(blocks_of(target)) == 4


def test_keep_frees_the_blocks_no_kept_step_names(one_task_learner, tmp_path):
    target = tmp_path / "l"
    learner = grow(one_task_learner, target, 3)
    fake_step(learner, 4.0)
    mark(learner, 4.0)
    learner.save(target, keep=1)
    stored = on_disk(target)
    assert list(stored["kept_steps"]) == ["4"] and blocks_of(target) == set(stored["objects"]["4"])
    named = {rel for files in stored["kept_steps"].values() for rel in files.values()}
    assert set(tree(target)) == named | {f"objects/{s}" for s in stored["objects"]["4"]} | {"learner.json"}
    assert set(stored["hashes"]) == set(tree(target)) - {"learner.json"}


def test_a_growing_test_sample_stores_earlier_classes_once(one_task_learner, tmp_path, monkeypatch):
    monkeypatch.setattr(objects, "MIN_BYTES", 4096)
    monkeypatch.setattr(objects, "BLOCK_BYTES", 16 * 768)  # 16 images of 3x16x16 a block
    learner = Learner.load(one_task_learner)
    size = learner.state.image_size
    gen = torch.Generator().manual_seed(0)
    first = CarriedSample(torch.randint(0, 256, (40, 3, size, size), dtype=torch.uint8, generator=gen),
                          torch.zeros(40, dtype=torch.long))
    learner.test_sample = first
    learner.state.test_sample = dataclasses.replace(learner.state.test_sample, counts=[40, 0])
    learner.save(tmp_path / "l")
    fake_step(learner, 2.0)
    learner.test_sample = joined(first, CarriedSample(
        torch.randint(0, 256, (40, 3, size, size), dtype=torch.uint8, generator=gen), torch.full((40,), 2)))
    learner.state.test_sample = dataclasses.replace(learner.state.test_sample, counts=[40, 0, 40])
    learner.save(tmp_path / "l")
    stored = on_disk(tmp_path / "l")
    per_step = {}
    for n, files in stored["kept_steps"].items():
        sample = tmp_path / "l" / files["test_sample"]
        per_step[int(n)] = list(objects.refs(sample.read_bytes(), sample)["images"].parts)
        assert set(per_step[int(n)]) <= set(stored["objects"][n])
    assert len(per_step[1]) == 3 and len(per_step[2]) == 6  # 16 + 16 + 8 images a class
    assert per_step[2][:3] == per_step[1]  # the earlier task's images: the same blocks, stored once
    assert len(set(stored["objects"]["1"]) & set(stored["objects"]["2"])) >= 3
    again = Learner.load(tmp_path / "l")
    assert torch.equal(again.test_sample.images, learner.test_sample.images)
    assert torch.equal(Learner.load(tmp_path / "l", step=1).test_sample.images, first.images)


def damaged_copy(source: Path, target: Path) -> tuple[Path, str]:
    shutil.copytree(source, target)
    return target, sorted(blocks_of(target))[0]


@pytest.mark.parametrize("how", ["flip", "cut", "missing", "unlisted", "link"])
def test_a_damaged_or_unlisted_block_is_refused_in_one_sentence(one_task_learner, tmp_path, how):
    grow(one_task_learner, tmp_path / "good", 2)
    target, sha = damaged_copy(tmp_path / "good", tmp_path / "bad")
    users = [int(n) for n, shas in on_disk(target)["objects"].items() if sha in shas]
    block = target / "objects" / sha
    if how == "flip":
        raw = bytearray(block.read_bytes())
        raw[len(raw) // 2] ^= 1
        block.write_bytes(bytes(raw))
        expect = r"objects/[0-9a-f]{64} is not the file learner.json recorded \(its SHA-256 differs\)"
    elif how == "cut":
        block.write_bytes(block.read_bytes()[:-5])
        expect = r"objects/[0-9a-f]{64} is not the file learner.json recorded \(it is \d+ bytes"
    elif how == "link":  # the same bytes behind a symbolic link: never followed
        shutil.move(block, tmp_path / "elsewhere")
        block.symlink_to(tmp_path / "elsewhere")
        expect = r"holds a symbolic link, objects/[0-9a-f]{64}"
    elif how == "missing":
        block.unlink()
        expect = r"is missing objects/[0-9a-f]{64}"
    else:  # the step's list no longer names a block its file uses (and hashes drops its record)
        state = on_disk(target)
        for step, shas in state["objects"].items():
            if sha in shas:
                shas.remove(sha)
        state["hashes"].pop(f"objects/{sha}")
        state["objects"] = {k: v for k, v in state["objects"].items() if v}
        (target / "learner.json").write_text(json.dumps(state))
        expect = r"names a block of .* that learner.json does not list for its step"
    before = tree(target)
    assert users
    for step in users:
        with pytest.raises(LearnerError, match=expect):
            Learner.load(target, step=step)
    assert tree(target) == before


def test_a_format_3_learner_is_read_and_its_next_save_stores_blocks(one_task_learner, tmp_path):
    target = tmp_path / "v3"
    shutil.copytree(one_task_learner, target)
    state = on_disk(target)  # the fixture holds no tensor large enough for a block: what format 3 wrote
    assert "objects" not in state or state["objects"] == {}
    state.pop("objects", None)
    state["format_version"] = 3
    (target / "learner.json").write_text(json.dumps(state, indent=2))
    learner = Learner.load(target)
    fake_step(learner, 2.0)
    mark(learner, 2.0)
    learner.save(target)
    stored = on_disk(target)
    assert stored["format_version"] == 4 and list(stored["objects"]) == ["2"]
    assert Learner.load(target, step=1).state.steps == 1 and float(Learner.load(target).extra["changing"][0]) == 2.0


def test_a_push_is_whole_files_and_the_pulled_learner_stores_blocks_again(fake_hub, one_task_learner, tmp_path):
    """What goes to the Hub is one step of whole files: its model.safetensors is the weights any safetensors
    reader (``--pretrained OWNER/NAME``, a script) expects; the pulled learner's next save stores blocks."""
    from safetensors.torch import load_file

    local = tmp_path / "local"
    grow(one_task_learner, local, 2)
    api.push(local, "tester/blocks")
    pulled = api.pull("tester/blocks", tmp_path / "pulled").path
    assert not blocks_of(pulled) and on_disk(pulled).get("objects") in (None, {}, {"2": []})
    whole = load_file(pulled / "model.safetensors")
    assert torch.equal(whole["extra.frozen"], torch.arange(70_000, dtype=torch.float32))
    assert float(whole["extra.changing"][0]) == 2.0
    learner = Learner.load(pulled)
    assert float(learner.extra["changing"][0]) == 2.0
    fake_step(learner, 3.0)
    mark(learner, 3.0)
    learner.save(pulled)
    stored = on_disk(pulled)
    assert list(stored["objects"]) == ["3"] and len(blocks_of(pulled)) == 2
    assert float(Learner.load(pulled, step=2).extra["changing"][0]) == 2.0
