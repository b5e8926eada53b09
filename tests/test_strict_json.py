"""Strict JSON everywhere: learner.json, every state.json, --json output and the card's metadata hold no NaN
or Infinity (a metric without a value is null); a learner written before, with bare NaN, still reads, grows
and rolls back. A frozen-backbone step's banner names no training precision."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.engine.loop import TrainConfig
from sbcli.hub.card import CardFacts, model_card
from sbcli.learner.state import Learner
from sbcli.learner.store import commit
from sbcli.run import banner

runner = CliRunner()


def refuse(name: str) -> None:
    raise ValueError(f"not strict JSON: {name}")


def strict_load(text: str) -> object:
    """What a parser outside Python (JSON.parse) accepts: no NaN, Infinity or -Infinity."""
    return json.loads(text, parse_constant=refuse)


def every_json(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.json") if p.name != ".lock.json")


def test_learner_json_state_json_json_output_and_card_are_strict(one_task_learner, tmp_path):
    learner = tmp_path / "L"
    shutil.copytree(one_task_learner, learner)
    files = every_json(learner)
    assert {p.name for p in files} >= {"learner.json", "state.json"}
    for path in files:
        strict_load(path.read_text())
    state = json.loads((learner / "learner.json").read_text())
    assert state["history"][0]["metrics"]["intra_old"] is None  # one step: no old class, no value
    loaded = Learner.load(learner).state
    assert loaded.history[0].metrics.intra_old != loaded.history[0].metrics.intra_old  # read back as NaN
    result = runner.invoke(app, ["evaluate", str(learner), "--json"])
    assert result.exit_code == 0, result.output
    assert strict_load(result.stdout)["metrics"]["intra_old"] is None
    card = model_card(loaded, CardFacts("user/colors", "none", 0, 0, ["model.safetensors"]))
    meta = yaml.safe_load(card.split("---")[1])
    numbers = [r["metrics"][0]["value"] for e in meta["model-index"] for r in e["results"]]
    assert numbers and all(isinstance(v, (int, float)) and v == v and abs(v) != float("inf") for v in numbers)
    for line in card.splitlines():  # the settings the card writes as JSON
        if line.startswith("- ") and ": `{" in line:
            strict_load(line.split("`")[1])


def test_a_learner_written_with_bare_nan_still_reads_grows_and_rolls_back(color_data, tmp_path, monkeypatch):
    def old_writer(state):  # what sbcli wrote before: Python's json with NaN as a bare word
        return (json.dumps(state, indent=2, allow_nan=True) + "\n").encode("utf-8")

    out = tmp_path / "old"
    with monkeypatch.context() as m:
        m.setattr(commit, "state_bytes", old_writer)
        run = api.RunOptions(method="std", width=0.125, train=TrainConfig(epochs=1, batch_size=16), memory=8,
                             device="cpu")
        api.train(api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]),
                                      image_size=16, tasks=1), run, out)
    assert "NaN" in (out / "learner.json").read_text()
    assert Learner.load(out).state.num_classes == 2
    torch.manual_seed(0)
    api.add_task(out, color_data["task2_train"], color_data["task2_test"], device="cpu")
    strict_load((out / "learner.json").read_text())
    api.rollback(out, 1)  # back to the step written with NaN: its learner.json is strict again
    strict_load((out / "learner.json").read_text())
    assert Learner.load(out).state.num_classes == 2


@pytest.mark.parametrize("trains, text", [(True, "on cpu in bf16."), (False, "on cpu, features in fp32.")])
def test_a_frozen_backbone_step_names_no_training_precision(trains, text):
    start = banner.banner(4, 40, 8, 16, [], "resnet18, width x0.125", TrainConfig(precision="bf16"),
                          torch.device("cpu"), trains=trains)
    assert start.text().endswith(text)
    assert start.precision == ("bf16" if trains else "fp32")
    assert ("bf16" in start.text()) == trains
