"""The pull -> grow -> push journey for every learner the zoo ships and every learner format sbcli reads.

Each learner is pushed with the real ``huggingface_hub`` client to the loopback FakeHub (the
``fake_hub`` fixture) and the card that arrives is read back: it names each task's data, never a
path of the machine that trained it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import huggingface_hub as hf
import pytest
from fake_hub import FakeHub
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.learner.state import read_state

ZOO_V1 = Path(__file__).resolve().parents[1] / "zoo" / "learners" / "demo-sb-tiny"  # format 1
BUNDLED = [e.name for e in api.zoo() if e.kind == "bundled"]


def card_of(repo: str) -> str:
    return Path(hf.hf_hub_download(repo, "README.md")).read_text(encoding="utf-8")


def test_the_zoo_bundles_a_learner_to_push():
    assert BUNDLED  # the parametrised push below is not vacuous


@pytest.mark.parametrize("name", BUNDLED)
def test_every_bundled_zoo_learner_pushes_with_sb_export(name: str, fake_hub: FakeHub, tmp_path: Path) -> None:
    pulled = api.pull(name, tmp_path / name).path
    res = CliRunner().invoke(app, ["export", str(pulled), "--to-hub", f"tester/{name}", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["hub"]["onnx"]["path"] == "model.onnx"  # in the repository, not a deleted temp file
    card = card_of(f"tester/{name}")
    state = read_state(pulled)
    assert f"{state.num_classes} classes learned in {state.steps} task steps" in card
    for task in state.tasks:
        assert f"{task.source['kind']}" in card


def test_a_learner_grown_from_the_zoo_pushes(fake_hub: FakeHub, color_data, tmp_path: Path) -> None:
    pulled = api.pull("demo-sb-tiny", tmp_path / "demo").path
    api.add_task(pulled, color_data["task2_train"], color_data["task2_test"], device="cpu",
                 options=api.AddTaskOptions(epochs=1))
    report = api.push(pulled, "tester/grown")
    assert report.to_json()["repo_id"] == "tester/grown"
    card = card_of("tester/grown")
    assert "| 3 | folder: task2 |" in card  # the grown step, named by the folder above train/test
    assert "| 3 | A 1, B 1, C 1" in card and "## Intended use and limitations" in card
    assert "| 2 | " in card and "not recorded" in card  # the zoo's own steps predate per-step settings


def test_a_format_1_learner_with_recorded_paths_pushes_without_them(fake_hub: FakeHub, tmp_path: Path) -> None:
    """sbcli 0.1 recorded each task's source as the paths it was read from."""
    learner = tmp_path / "v1"
    shutil.copytree(ZOO_V1, learner)
    stored = json.loads((learner / "learner.json").read_text())
    assert stored["format_version"] == 1
    for i, task in enumerate(stored["tasks"]):
        task["source"] = {"kind": "folder", "path": f"/home/someone/photos-{i}/train",
                          "test": f"/home/someone/photos-{i}/test", "image_size": 32}
    (learner / "learner.json").write_text(json.dumps(stored))
    api.push(learner, "tester/v1-paths")
    card = card_of("tester/v1-paths")
    assert "/home/someone" not in card and "photos-0" in card and "photos-1" in card


def test_a_format_2_learner_pushes(fake_hub: FakeHub, one_task_learner: Path, tmp_path: Path) -> None:
    learner = tmp_path / "v2"
    shutil.copytree(one_task_learner, learner)
    stored = json.loads((learner / "learner.json").read_text())
    del stored["hashes"]  # as format 2 wrote it: no hashes yet
    stored["format_version"] = 2
    (learner / "learner.json").write_text(json.dumps(stored))
    api.push(learner, "tester/v2")
    assert "| 1 | folder: task1 |" in card_of("tester/v2")


def test_the_card_names_the_data_and_each_steps_own_settings(fake_hub: FakeHub, one_task_learner: Path, color_data,
                                                             tmp_path: Path) -> None:
    learner = tmp_path / "named"
    shutil.copytree(one_task_learner, learner)
    options = api.AddTaskOptions(epochs=1, warmup_epochs=0.5, name="garden")
    api.add_task(learner, color_data["task2_train"], color_data["task2_test"], device="cpu", options=options)
    api.push(learner, "tester/named")
    card = card_of("tester/named")
    assert "| 1 | folder: task1 |" in card and "| 2 | folder: garden |" in card  # not "train (test: test)"
    assert "name: task1, garden" in card and "class folders" not in card  # the model-index dataset
    assert '| 2 | std 1 | as step 1, but `{"warmup_epochs": 0.5}` |' in card
    assert '"warmup_epochs": 0.0' in card.split("| 1 | base 1 | ", 1)[1].split("\n")[0]  # step 1 keeps its own warm-up
