"""Keeping old classes at small budgets: ``--incremental-lr`` (the lr of later steps) and
``--balance-epochs`` (class-balanced fine-tuning on the memory, sbcli.methods.balance)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sbcli import api
from sbcli.data.device import DeviceData, Normalization
from sbcli.engine.loop import Engine, Phase, TrainConfig, phase_lr
from sbcli.errors import ConfigError
from sbcli.methods.balance import balanced_finetune
from sbcli.methods.losses import ce_loss
from sbcli.nets import create_model

pytestmark = pytest.mark.usefixtures("one_thread")


def small_data(n_per_class: int = 4, classes: int = 3) -> DeviceData:
    labels = torch.arange(classes).repeat_interleave(n_per_class)
    return DeviceData(torch.randint(0, 256, (len(labels), 3, 8, 8), dtype=torch.uint8), labels)


def test_later_steps_start_from_the_incremental_lr_and_a_phase_may_set_its_own(sgd_lrs):
    cfg = TrainConfig(epochs=1, batch_size=4, lr=0.1, incremental_lr=0.01)
    assert [phase_lr(cfg, task) for task in (0, 1, 2, 5)] == [0.1, 0.1, 0.01, 0.01]
    assert phase_lr(TrainConfig(lr=0.1), 3) == 0.1  # unset: the paper's one lr for every step
    assert phase_lr(cfg, 2, Phase("x", lambda out: out.logits.sum(), 1, lr=0.5)) == 0.5
    seen = sgd_lrs
    torch.manual_seed(0)
    engine = Engine(cfg, torch.device("cpu"), Normalization(), seed=0)
    model = create_model("resnet32", 3, 0.25)
    loss = Phase("p", lambda out: ce_loss(out.logits, out.targets), 1)
    for task in (1, 2):
        engine.for_step(task).run(model, small_data(), loss)
    assert seen == pytest.approx([0.1] * 3 + [0.01] * 3)


def test_the_balance_phase_trains_on_the_memory_alone_at_its_lr_and_keeps_a_zero_bias(sgd_lrs):
    torch.manual_seed(0)
    model = create_model("resnet32", 3, 0.25)
    with torch.no_grad():
        model.head.bias.zero_()
    engine = Engine(TrainConfig(epochs=1, batch_size=4, lr=0.1), torch.device("cpu"), Normalization(), seed=0)
    seen = sgd_lrs
    memory = small_data(n_per_class=4)
    report = balanced_finetune(model, (memory.images, memory.labels), engine, epochs=2, lr=0.02, hold_bias_at_zero=True)
    assert report is not None and report.name == "balance" and report.epochs == 2
    # 12 images / batch 4 = 3 steps an epoch; from its own lr, under the step's schedule (a milestone at 0.3 of 2 epochs)
    assert seen == pytest.approx([0.02] * 3 + [0.002] * 3)
    assert torch.all(model.head.bias == 0)
    empty = (torch.zeros(0, 3, 8, 8, dtype=torch.uint8), torch.zeros(0, dtype=torch.long))
    assert balanced_finetune(model, empty, engine, 2, 0.02, True) is None
    assert balanced_finetune(model, (memory.images, memory.labels), engine, 0, 0.02, True) is None


def test_a_run_records_the_balance_phase_after_every_later_step_and_the_options(tmp_path: Path, four_colors):
    cfg = TrainConfig(epochs=1, batch_size=16, incremental_lr=0.05, balance_epochs=2, balance_lr=0.02)
    run = api.RunOptions(method="std", width=0.125, train=cfg, memory=16, device="cpu")
    api.train(api.SequenceOptions(source=str(four_colors["train"]), test=str(four_colors["test"]), tasks=2), run,
              tmp_path / "l")
    learner = json.loads((tmp_path / "l" / "learner.json").read_text())
    recorded = learner["train_config"]
    assert (recorded["incremental_lr"], recorded["balance_epochs"], recorded["balance_lr"]) == (0.05, 2, 0.02)
    first, second = learner["history"]
    assert [p["name"] for p in first["phases"]] == ["base"]  # nothing to balance after the first task
    assert [p["name"] for p in second["phases"]] == ["std", "balance"]
    assert second["phases"][1]["epochs"] == 2
    assert set(second["record"]["before_balance"]) >= {"overall", "old", "new"}


@pytest.mark.parametrize("bad", [{"balance_epochs": -1}, {"balance_lr": 0.0}, {"incremental_lr": -0.1}])
def test_bad_values_are_refused_in_one_sentence(bad):
    with pytest.raises(ConfigError, match="--balance-epochs must not be negative"):
        TrainConfig(**bad)


def test_the_cli_takes_them_and_refuses_a_negative_one_before_any_work(tmp_path: Path, four_colors):
    from typer.testing import CliRunner

    from sbcli.cli.app import app

    out = tmp_path / "l"
    result = CliRunner().invoke(app, ["train", str(four_colors["train"]), "--pretrained", "none", "--test", str(four_colors["test"]), "--out",
                                      str(out), "--balance-epochs", "-2", "--quiet"])
    assert result.exit_code != 0 and "--balance-epochs must not be negative" in result.output
    assert not out.exists()


def test_the_demo_runs_balance_by_default_and_folders_paper_recipes_and_sb_bench_do_not(tmp_path: Path):
    from sbcli.config import options
    from sbcli.config.options import bench_defaults

    given = {name: None for name in ("recipe", "source", "out")} | {"out": str(tmp_path / "x")}
    for source, epochs in ((None, 2), ("photos", 0)):  # a folder under --wa-clip lost accuracy with it (3 seeds)
        _, run, _ = options.build_options(given | {"source": source}, options.defaults_for(source))
        assert run.train.balance_epochs == epochs and run.train.incremental_lr is None
    _, asked, _ = options.build_options(given | {"source": "photos", "balance_epochs": 2}, options.defaults_for("photos"))
    assert asked.train.balance_epochs == 2
    for recipe in ("paper-10", "paper-2"):
        _, paper, _ = options.build_options(given | {"recipe": recipe, "source": "cifar100"}, options.defaults_for("cifar100"))
        assert paper.train.balance_epochs == 0
    assert "balance_epochs" not in bench_defaults("cifar100") and "balance_epochs" not in bench_defaults(None)
    _, asked, _ = options.build_options(given | {"balance_epochs": 0}, options.defaults_for(None))
    assert asked.train.balance_epochs == 0


def test_bic_drops_the_default_balancing_and_refuses_an_asked_one(tmp_path: Path):
    from sbcli.config import options

    given = {name: None for name in ("recipe", "source", "out")} | {"out": str(tmp_path / "x"), "method": "std",
                                                                      "inference": "bic"}
    _, run, _ = options.build_options(given, options.defaults_for(None))
    assert run.train.balance_epochs == 0
    with pytest.raises(ConfigError, match="--balance-epochs does not go with --inference bic"):
        options.build_options(given | {"balance_epochs": 2}, options.defaults_for(None))


def test_the_plan_counts_the_balancing_epochs_of_every_later_step():
    from sbcli.run.plan import sequence_epochs

    assert sequence_epochs("std", {"inference": "wa"}, 3, [2, 2, 2], balance=2) == [3, 5, 5]
    assert sequence_epochs("std", {"inference": "bic"}, 3, [2, 2, 2], balance=2) == [3, 3, 3]
    assert sequence_epochs("std", {"inference": "wa"}, 3, [2, 2, 2]) == [3, 3, 3]


def test_add_task_can_turn_balancing_on_for_a_learner_that_had_none(tmp_path: Path, color_data):
    from typer.testing import CliRunner

    from sbcli.cli.app import app

    cfg = TrainConfig(epochs=1, batch_size=16, balance_epochs=0)
    run = api.RunOptions(method="std", width=0.125, train=cfg, memory=16, device="cpu")
    out = tmp_path / "l"
    api.train(api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), tasks=1),
              run, out)
    before = (out / "learner.json").read_bytes()
    refused = CliRunner().invoke(app, ["add-task", str(out), str(color_data["task2_train"]), "--test",
                                       str(color_data["task2_test"]), "--balance-epochs", "-1", "--quiet"])
    assert refused.exit_code != 0 and "--balance-epochs -1 is negative" in refused.output
    assert (out / "learner.json").read_bytes() == before  # refused before any work
    done = CliRunner().invoke(app, ["add-task", str(out), str(color_data["task2_train"]), "--test",
                                    str(color_data["task2_test"]), "--balance-epochs", "1", "--device", "cpu", "--quiet"])
    assert done.exit_code == 0, done.output
    learner = json.loads((out / "learner.json").read_text())
    assert learner["train_config"]["balance_epochs"] == 1
    assert [p["name"] for p in learner["history"][-1]["phases"]] == ["std", "balance"]


@pytest.mark.parametrize("before_wa", [False, True])
def test_balancing_before_weight_aligning_leaves_the_aligned_head_last(tmp_path: Path, four_colors, before_wa: bool):
    from sbcli.learner.state import Learner

    cfg = TrainConfig(epochs=1, batch_size=16, balance_epochs=1, balance_before_wa=before_wa)
    run = api.RunOptions(method="std", width=0.125, train=cfg, memory=16, device="cpu")
    out = tmp_path / "l"
    api.train(api.SequenceOptions(source=str(four_colors["train"]), test=str(four_colors["test"]), tasks=2), run, out)
    stored = json.loads((out / "learner.json").read_text())
    step2 = stored["history"][-1]
    assert stored["train_config"]["balance_before_wa"] is before_wa
    assert [p["name"] for p in step2["phases"]] == ["std", "balance"] and "before_balance" in step2["record"]
    norms = Learner.load(out).model.head.weight.detach().norm(dim=1)
    old, new = float(norms[:2].mean()), float(norms[2:].mean())
    # aligning last leaves the new rows' mean norm equal to the old rows'; balancing last moves it again
    assert (old == pytest.approx(new, rel=1e-5)) is before_wa
    assert step2["record"]["wa_factor"] > 0 and "before_wa" in step2["record"]
    in_order = ["before_balance", "before_wa", "wa_factor"] if before_wa else ["before_wa", "wa_factor", "before_balance"]
    assert list(step2["record"]) == in_order  # the stage reports, in the order the step's tail ran them


def test_a_split_and_bridge_step_ends_with_the_align_stage_its_record_keeping_after_c_as_the_accuracy_before(
        tmp_path: Path, four_colors):
    from sbcli.learner.state import Learner

    cfg = TrainConfig(epochs=1, batch_size=16)
    run = api.RunOptions(method="sb", width=0.125, train=cfg, memory=16, device="cpu")
    out = tmp_path / "l"
    api.train(api.SequenceOptions(source=str(four_colors["train"]), test=str(four_colors["test"]), tasks=2), run, out)
    record = json.loads((out / "learner.json").read_text())["history"][-1]["record"]
    assert list(record)[-2:] == ["after_C", "wa_factor"] and "before_wa" not in record
    norms = Learner.load(out).model.head.weight.detach().norm(dim=1)
    assert float(norms[2:].mean()) == pytest.approx(float(norms[:2].mean()), rel=1e-5)  # aligned last


@pytest.mark.parametrize("extra", [["--balance-epochs", "0"], ["--inference", "icarl"], ["--method", "sb", "--inference", "none"]])
def test_balancing_before_aligning_is_refused_where_there_is_no_balancing_or_no_aligning(tmp_path: Path, four_colors,
                                                                                           extra: list[str]):
    from typer.testing import CliRunner

    from sbcli.cli.app import app

    out = tmp_path / "l"
    done = CliRunner().invoke(app, ["train", str(four_colors["train"]), "--pretrained", "none", "--out", str(out), "--balance-before-wa",
                                    "--balance-epochs", "2", *extra, "--quiet"])
    assert done.exit_code != 0 and "--balance-before-wa" in done.output and "Traceback" not in done.output
    assert not out.exists()
