"""The journey of a learner that travels, end to end, with the real huggingface_hub client against
the loopback FakeHub: train on folders A (two tasks) -> push -> rename A away -> pull in a fresh
cache -> add-task with folders B -> evaluate (on the carried test sample) -> export ONNX -> push
step 3 -> pull ``@step-2`` and ``@step-3`` and check both. Nothing pushed names the trainer's folders.
"""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub as hf
import pytest
from conftest import write_class_folder
from conftest_hub import point_hub_client_at
from fake_hub import FakeHub

from sbcli import api
from sbcli.engine.loop import TrainConfig
from sbcli.errors import LearnerError
from sbcli.learner.state import Learner

REPO = "tester/travelling"
A_CLASSES, B_CLASSES = ["red", "green", "blue", "yellow"], ["purple", "cyan"]


def make_folders(root: Path, classes: list[str]) -> Path:
    write_class_folder(root / "train", classes, 24, seed=1)
    write_class_folder(root / "test", classes, 8, seed=2)
    return root


def pushed_bytes(revision: str) -> dict[str, bytes]:
    folder = Path(hf.snapshot_download(REPO, revision=revision))
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def assert_no_machine_paths(files: dict[str, bytes], *paths: Path) -> None:
    for name, data in files.items():
        for path in paths:
            assert str(path).encode() not in data, f"{name} names {path}"


def test_a_learner_travels(fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread) -> None:
    home = tmp_path / "alice-home"  # the trainer's machine: its folders must not show in anything pushed
    folders_a, folders_b = make_folders(home / "photos" / "A", A_CLASSES), make_folders(tmp_path / "bob" / "B", B_CLASSES)
    run = api.RunOptions(method="sb", width=0.125, train=TrainConfig(epochs=6, batch_size=16), memory=24, device="cpu")
    seq = api.SequenceOptions(source=str(folders_a / "train"), test=str(folders_a / "test"), image_size=16, tasks=2)
    trained = api.train(seq, run, home / "learner")
    first = api.push(home / "learner", REPO, with_memory=True)
    assert list(first.revisions) == ["main", "step-2"]

    # Another machine: A is gone, a fresh Hub cache and a fresh sbcli cache.
    folders_a.rename(home / "photos" / "A-away")
    point_hub_client_at(monkeypatch, fake_hub.endpoint, tmp_path / "bob" / "hf")
    monkeypatch.setenv("SBCLI_CACHE", str(tmp_path / "bob" / "cache"))
    pulled = api.pull(REPO, tmp_path / "bob" / "learner")
    assert pulled.contents["exemplar_images"] == 24 and pulled.contents["test_images"] == 32
    mine = tmp_path / "bob" / "learner"
    step = api.add_task(mine, folders_b / "train", folders_b / "test", device="cpu")
    assert step.step == 3 and any("task 1" in n and "carried test sample" in n for n in step.notes), step.notes
    assert any(n.startswith(f"README.md in {mine} is now stale (it still describes step 2)") for n in step.notes), step.notes

    folders_b.rename(tmp_path / "bob" / "B-away")
    result = api.evaluate(mine, device="cpu")
    assert result.test_data.used == "sample" and result.test_images == 48
    metrics = result.metrics
    assert metrics.old > 60 and metrics.new > 60, metrics  # chance is 100/6 %

    report = api.export_onnx(mine, tmp_path / "bob" / "model.onnx")
    assert report.parity.argmax_agreement == 1.0
    third = api.push(mine, REPO)
    assert list(third.revisions) == ["main", "step-3"]

    refs = sorted(b.name for b in hf.HfApi().list_repo_refs(REPO).branches)
    assert refs == ["main", "step-2", "step-3"]
    for revision, classes in (("step-2", A_CLASSES), ("step-3", A_CLASSES + B_CLASSES)):
        learner = Learner.load(api.pull(f"{REPO}@{revision}", tmp_path / revision).path)
        assert sorted(learner.state.class_names) == sorted(classes) and learner.state.steps == len(classes) // 2
        assert learner.test_sample is not None and learner.test_sample.counts(len(classes)) == [8] * len(classes)
        files = pushed_bytes(revision)
        assert_no_machine_paths(files, home, tmp_path, Path.home())
        card = hf.ModelCard.load(REPO, repo_type="model") if revision == "step-3" else None
        if card is not None:  # main is step 3: its model-index has every step, and names only pushed branches
            configs = {r.dataset_config for r in card.data.eval_results}
            assert configs == {"step-1", "step-2", "step-3"} and "step-1" not in card.text
            assert "`step-2`" in card.text and "Training images inside: no." in card.text
        evaluated = api.evaluate(tmp_path / revision, device="cpu")
        assert evaluated.test_data.used == "sample" and evaluated.metrics.overall > 50

    step2 = Learner.load(tmp_path / "step-2")
    for key, value in trained.model.state_dict().items():
        assert (step2.model.state_dict()[key] == value.cpu()).all(), key
    state = json.loads((tmp_path / "step-3" / "learner.json").read_text())
    assert [t["source"]["name"] for t in state["tasks"]] == ["train", "train", "train"]
    with pytest.raises(LearnerError, match="--no-rehearsal"):  # step 3 went up without its memory
        api.add_task(tmp_path / "step-3", tmp_path / "bob" / "B-away" / "train", device="cpu")
