"""``--val-fraction``: the held-out split of each step, and every phase's best epoch chosen on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.data.device import DeviceData, Normalization
from sbcli.engine import selection
from sbcli.engine.loop import Engine, Phase, TrainConfig
from sbcli.errors import ConfigError
from sbcli.methods.losses import ce_loss
from sbcli.nets import create_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_holdout_takes_a_share_of_every_class_and_never_all_of_it():
    labels = torch.tensor([0] * 10 + [1] * 3 + [2] * 1 + [3] * 2)
    held = selection.holdout_mask(labels, 0.2, seed=5)
    counts = {c: int(held[labels == c].sum()) for c in range(4)}
    assert counts == {0: 2, 1: 1, 2: 0, 3: 1}  # round(0.2 n), at least 1 where n >= 2, never the last one
    assert torch.equal(held, selection.holdout_mask(labels, 0.2, seed=5))
    assert not torch.equal(held, selection.holdout_mask(labels, 0.2, seed=6))
    assert not selection.holdout_mask(labels, 0.0, seed=5).any()


def test_split_holds_out_of_new_images_and_exemplars_alike():
    new = (torch.arange(20).view(20, 1), torch.tensor([3] * 10 + [4] * 10))
    memory = (torch.arange(100, 110).view(10, 1), torch.tensor([0] * 5 + [1] * 5))
    parts, held = selection.split([new, memory], 0.2, seed=1)
    assert [len(p[1]) for p in parts] == [16, 8] and len(held[1]) == 6
    assert sorted(torch.cat([parts[0][0], parts[1][0], held[0]]).flatten().tolist()) == list(range(20)) + list(range(100, 110))
    assert torch.bincount(held[1], minlength=5).tolist() == [1, 1, 0, 2, 2]


def test_a_phase_keeps_its_best_epoch_on_the_validation_split(monkeypatch):
    torch.manual_seed(0)
    model = create_model("resnet32", 3, 0.25)
    labels = torch.arange(3).repeat_interleave(4)
    data = DeviceData(torch.randint(0, 256, (12, 3, 8, 8), dtype=torch.uint8), labels)
    snapshots: dict[int, dict] = {}

    def snapshot(event) -> None:
        snapshots[event.epoch] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    scores = iter([40.0, 90.0, 70.0, 90.0, 10.0])
    monkeypatch.setattr(selection.Validator, "score", lambda self, engine, m: next(scores))
    engine = Engine(TrainConfig(batch_size=4), torch.device("cpu"), Normalization(), seed=0, on_progress=snapshot)
    engine = engine.for_step(0, selection.Validator(data.images[:3], labels[:3], num_classes=3, every=1))
    report = engine.run(model, data, Phase("base", lambda out: ce_loss(out.logits, out.targets), 5))
    assert report.extra["selected_epoch"] == 4 and report.extra["val_accuracy"] == 90.0  # the later of two ties
    assert report.extra["val_scores"] == [40.0, 90.0, 70.0, 90.0, 10.0]
    for key, value in model.state_dict().items():
        assert torch.equal(value, snapshots[4][key]), key
    assert any(not torch.equal(snapshots[5][k], snapshots[4][k]) for k in snapshots[4])


def test_scores_every_k_epochs_and_at_the_end_and_skips_other_networks(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(selection.Validator, "score", lambda self, engine, m: calls.append(1) or 50.0)
    validator = selection.Validator(torch.zeros(1, 3, 8, 8, dtype=torch.uint8), torch.zeros(1, dtype=torch.long), 3, every=2)
    picked = selection.PhaseSelection.start(validator, create_model("resnet32", 3, 0.25))
    for epoch in range(1, 6):
        picked.after_epoch(None, create_model("resnet32", 3, 0.25), epoch, 5)
    assert len(calls) == 3  # epochs 2, 4 and the last
    assert selection.PhaseSelection.start(validator, create_model("resnet32", 2, 0.25)) is None


def test_a_run_records_the_fraction_and_each_phases_choice(tmp_path: Path):
    from conftest import write_class_folder

    train = write_class_folder(tmp_path / "train", ["red", "green", "blue", "yellow"], 10, seed=1)
    test = write_class_folder(tmp_path / "test", ["red", "green", "blue", "yellow"], 4, seed=2)
    run = api.RunOptions(method="std", width=0.125, memory=8, device="cpu",
                         train=TrainConfig(epochs=2, batch_size=8, val_fraction=0.2, val_every=1))
    api.train(api.SequenceOptions(source=str(train), test=str(test), tasks=2), run, tmp_path / "l")
    state = json.loads((tmp_path / "l" / "learner.json").read_text())
    assert state["train_config"]["val_fraction"] == 0.2
    for step in state["history"]:
        for phase in step["phases"]:
            assert phase["selected_epoch"] in (1, 2) and len(phase["val_scores"]) == 2


def test_bad_fractions_are_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match="val-fraction"):
        TrainConfig(val_fraction=1.0)
    result = CliRunner().invoke(app, ["train", "--val-fraction", "-0.1", "--out", str(tmp_path / "x")])
    assert result.exit_code != 0 and "val-fraction" in result.output and not (tmp_path / "x").exists()
