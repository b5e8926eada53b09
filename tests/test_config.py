"""The config layer: every setting reachable from the CLI, recipes and the Python API, and recorded."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli import bench as bench_cmd
from sbcli.cli import train as train_cmd
from sbcli.cli.app import app
from sbcli.config.options import PHASE_EPOCHS, build_options, engine_keys, method_keys, recipe_keys
from sbcli.data.device import DeviceData
from sbcli.engine.loop import TrainConfig, make_optimizer, make_schedule
from sbcli.engine.schedule import steps_per_epoch
from sbcli.errors import ConfigError

ZOO_RECIPES = Path(__file__).resolve().parents[1] / "zoo" / "recipes"


def cli_given(command=train_cmd.train, **options) -> dict:
    """What a command hands to the config layer: every option at its default, then ``options``."""
    params = inspect.signature(command).parameters
    return {**{name: p.default for name, p in params.items() if name != "json_out"}, **options}


def test_every_engine_and_method_setting_is_a_train_option_and_a_recipe_key():
    options = set(inspect.signature(train_cmd.train).parameters)
    settings = engine_keys() | (method_keys() - set(PHASE_EPOCHS))
    assert settings - options == set()
    assert {"weight_decay", "nesterov", "milestones", "lr_decay", "drop_last", "threads"} <= engine_keys()
    assert {"aux_epochs", "bic_val_fraction", "first_task_rules"} <= method_keys()
    assert (settings - {"compile", "cuda_graphs", "precision", "threads", "eval_batch_size"}) <= recipe_keys()
    assert not {"device", "out", "threads"} & recipe_keys()


def test_every_engine_setting_is_a_bench_option():
    assert engine_keys() - set(inspect.signature(bench_cmd.bench).parameters) == set()


def test_engine_settings_from_the_command_line_reach_the_train_config():
    given = cli_given(source="demo", weight_decay=1e-3, nesterov=False, momentum=0.5, milestones="0.5,0.75",
                      lr_decay=0.2, drop_last=False, threads=1, eval_batch_size=64)
    _, run, _ = build_options(given)
    assert run.train == TrainConfig(epochs=8, batch_size=64, lr=0.1, momentum=0.5, nesterov=False, weight_decay=1e-3,
                                    milestones=(0.5, 0.75), lr_decay=0.2, drop_last=False, threads=1,
                                    eval_batch_size=64, warmup_epochs=1.0, zero_init_residual=False, balance_epochs=2)


def test_method_settings_from_the_command_line_reach_the_method_config():
    _, run, _ = build_options(cli_given(method="dd", aux_epochs=3, first_task_rules=False))
    # wa_clip: the own-data default under WA (sbcli.defaults.DEFAULTS, the "own" column)
    assert {k: v for k, v in run.method_options.items() if v is not None} == {"aux_epochs": 3, "first_task_rules": False,
                                                                            "wa_clip": True}
    _, run, _ = build_options(cli_given(method="std", inference="bic", bic_val_fraction=0.25))
    assert run.method_options["bic_val_fraction"] == 0.25


@pytest.mark.parametrize(("option", "value", "words"), [
    ("milestones", "0.3,x", "--milestones takes fractions"), ("milestones", "0.5,1.5", "in (0, 1]"),
    ("threads", 0, "--threads"), ("weight_decay", -1.0, "--weight-decay"), ("lr_decay", 0.0, "--lr-decay"),
])
def test_bad_engine_settings_are_refused(option, value, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        build_options(cli_given(**{option: value}))


def test_the_python_face_and_the_cli_agree():
    recipe = str(ZOO_RECIPES / "cifar100-paper-10.toml")
    seq, run = api.options(recipe=recipe, epochs=3, weight_decay=1e-4)
    cli_seq, cli_run, _ = build_options(cli_given(recipe=recipe, epochs=3, weight_decay=1e-4))
    assert (seq, run) == (cli_seq, cli_run)
    assert seq.source == "cifar100" and run.train.epochs == 3 and run.train.weight_decay == 1e-4
    assert api.options() == build_options(cli_given())[:2]  # the demo's defaults either way
    with pytest.raises(ConfigError, match="weight_decy is not a setting"):
        api.options(weight_decy=1e-4)


def test_a_recipe_may_set_engine_settings_but_not_where_the_run_goes(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('source = "cifar100"\nweight_decay = 2e-4\nmilestones = [0.5, 0.75]\nnesterov = false\n')
    _, run, _ = build_options(cli_given(recipe=str(good)))
    assert (run.train.weight_decay, run.train.milestones, run.train.nesterov) == (2e-4, (0.5, 0.75), False)
    bad = tmp_path / "bad.toml"
    bad.write_text('source = "cifar100"\ndevice = "cuda"\n')
    with pytest.raises(ConfigError, match="sets device"):
        build_options(cli_given(recipe=str(bad)))


def test_the_optimiser_and_schedule_follow_the_settings():
    model = torch.nn.Linear(2, 2)
    cfg = TrainConfig(nesterov=False, momentum=0.8, weight_decay=0.01, milestones=(0.5,), lr_decay=0.5, lr=1.0)
    opt = make_optimizer(model, cfg, torch.device("cpu"))
    group = opt.param_groups[0]
    assert (group["nesterov"], group["momentum"], group["weight_decay"]) == (False, 0.8, 0.01)
    sched = make_schedule(opt, cfg, epochs=10, batches_per_epoch=1)
    lrs = []
    for _ in range(10):
        sched.before_step()
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == [1.0] * 5 + [0.5] * 5


def test_the_schedule_fills_a_learning_rate_held_on_the_device_in_place():
    """A step replayed as a CUDA graph reads the lr from a tensor it captured: the schedule must fill that very tensor."""
    from sbcli.engine.graphs import device_lr

    opt = make_optimizer(torch.nn.Linear(2, 2), TrainConfig(lr=1.0, milestones=(0.5,), lr_decay=0.5), torch.device("cpu"))
    device_lr(opt, torch.device("cpu"))
    held = opt.param_groups[0]["lr"]
    sched = make_schedule(opt, TrainConfig(lr=1.0, milestones=(0.5,), lr_decay=0.5, warmup_epochs=1), epochs=4,
                          batches_per_epoch=2)
    seen = []
    for _ in range(4):
        for _ in range(2):
            sched.before_step()
            seen.append((float(held), sched.current))
        sched.step()
    assert opt.param_groups[0]["lr"] is held
    assert seen == [(0.5, 0.5), (1.0, 1.0), (1.0, 1.0), (1.0, 1.0), (0.5, 0.5), (0.5, 0.5), (0.5, 0.5), (0.5, 0.5)]


def test_drop_last_decides_whether_the_partial_batch_trains():
    data = DeviceData(torch.zeros(10, 3, 4, 4, dtype=torch.uint8), torch.zeros(10, dtype=torch.int64))
    sizes = {drop: [len(b) for b in data.batch_indices(4, torch.Generator().manual_seed(0), drop)] for drop in (True, False)}
    assert sizes == {True: [4, 4], False: [4, 4, 2]}
    assert [steps_per_epoch(10, 4, drop) for drop in (True, False)] == [2, 3]  # the warm-up counts the same steps


def test_cli_settings_are_recorded_in_the_learner(color_data, tmp_path, one_thread):
    out = tmp_path / "learner"
    res = CliRunner().invoke(app, ["train", str(color_data["task1_train"]), "--test", str(color_data["task1_test"]),
                                   "--out", str(out), "--method", "std", "--width", "0.125", "--epochs", "1",
                                   "--batch-size", "16", "--memory", "8", "--device", "cpu", "--image-size", "16",
                                   "--weight-decay", "0.001", "--no-nesterov", "--milestones", "0.5", "--lr-decay",
                                   "0.2", "--keep-last", "--threads", "1", "--no-first-task-rules"])
    assert res.exit_code == 0, res.output
    state = json.loads((out / "learner.json").read_text())
    train = state["train_config"]
    assert (train["weight_decay"], train["nesterov"], train["milestones"], train["lr_decay"]) == (0.001, False, [0.5], 0.2)
    assert (train["drop_last"], train["threads"]) == (False, 1)
    assert state["method_config"]["first_task_rules"] is False
