"""`sb bench`: the grid runs, writes Table 1 (Markdown + JSON) and figures, and resumes."""

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import write_class_folder
from typer.testing import CliRunner

from sbcli import api, bench
from sbcli.cli.app import app
from sbcli.engine.loop import TrainConfig
from sbcli.errors import ConfigError
from sbcli.learner.records import StepRecord
from sbcli.learner.state import read_state
from sbcli.metrics import StepMetrics, average_incremental


@pytest.fixture(scope="module")
def colors(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bench-colors")
    classes = ["red", "green", "blue", "yellow"]
    return {"train": write_class_folder(root / "train", classes, 16, seed=1),
            "test": write_class_folder(root / "test", classes, 6, seed=2)}


def plan(colors, methods=("finetune", "std-wa"), tasks=(2,), epochs=1) -> bench.BenchPlan:
    seq = api.SequenceOptions(source=str(colors["train"]), test=str(colors["test"]), image_size=16)
    run = api.RunOptions(width=0.125, train=TrainConfig(epochs=epochs, batch_size=16), memory=8, device="cpu")
    return bench.BenchPlan(tuple(methods), tuple(tasks), seq, run)


@pytest.fixture(scope="module")
def finished(colors, tmp_path_factory) -> tuple[Path, bench.BenchResult]:
    out = tmp_path_factory.mktemp("bench") / "grid"
    return out, bench.run_bench(plan(colors), out, plots=True)


def test_bench_writes_the_table_from_its_cells(finished):
    out, result = finished
    assert [(c.method, c.tasks) for c in result.ran] == [("finetune", 2), ("std-wa", 2)]
    table = json.loads((out / "table.json").read_text())
    assert [r["name"] for r in table["methods"]] == ["finetune", "std-wa"]
    for row in table["methods"]:
        history = read_state(out / "cells" / f"{row['name']}-T2").history
        overall = [h.metrics.overall for h in history]
        cell = row["cells"]["2"]
        assert cell["avg_2_to_T"] == pytest.approx(average_incremental(overall, skip_first=True))
        assert cell["avg_1_to_T"] == pytest.approx(average_incremental(overall, skip_first=False))
        assert cell["classes"] == [2, 4] and cell["intra_new"] == pytest.approx(history[1].metrics.intra_new)
    md = (out / "table.md").read_text()
    assert "| method | 2 tasks |" in md and "| STD + WA |" in md and "Steps 2..T" in md and "Steps 1..T" in md
    assert f"{table['methods'][1]['cells']['2']['avg_2_to_T']:.2f}" in md
    assert table["paper"] is None  # a folder of colours is not one of the paper's datasets


def test_bench_draws_both_figures(finished):
    out, result = finished
    for name in ("accuracy_per_step.png", "intra_old_new.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 400_000
        assert out / name in result.files


def test_a_finished_cell_is_not_run_again(finished, colors, monkeypatch):
    out, _ = finished
    stamps = {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/learner.json")}
    assert len(stamps) == 2

    def no_training(*args, **kwargs):
        raise AssertionError("a finished cell was trained again")

    monkeypatch.setattr(api, "train", no_training)
    result = bench.run_bench(plan(colors), out, plots=False)
    assert result.ran == [] and len(result.skipped) == 2
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps


class Interrupted(Exception):
    pass


def test_an_interrupted_grid_resumes_where_it_stopped(colors, tmp_path):
    out = tmp_path / "grid"
    actions = []

    def stop_after_first_step(summary):
        raise Interrupted

    with pytest.raises(Interrupted):
        bench.run_bench(plan(colors, methods=("finetune",)), out, plots=False, on_step=stop_after_first_step)
    assert read_state(out / "cells" / "finetune-T2").steps == 1
    result = bench.run_bench(plan(colors, methods=("finetune",)), out, plots=False,
                             on_cell=lambda cell, i, n, action: actions.append(action))
    assert actions == ["resume"] and read_state(out / "cells" / "finetune-T2").steps == 2
    assert result.table["methods"][0]["cells"]["2"]["classes"] == [2, 4]


def test_another_budget_in_the_same_directory_is_refused(finished, colors):
    out, _ = finished
    with pytest.raises(ConfigError, match="run.train.epochs"):
        bench.run_bench(plan(colors, epochs=2), out, plots=False)


def test_unknown_method_is_refused_with_the_known_names(colors):
    with pytest.raises(ConfigError, match="std-wa"):
        plan(colors, methods=("std_wa",))


def test_sb_cells_get_the_papers_rho_per_task_count(colors):
    p = plan(colors, methods=("sb-wa",), tasks=(5, 10))
    assert bench.cell_options(p, bench.Cell("sb-wa", 5), "tiny-imagenet")[1].method_options == {"inference": "wa", "rho": 1.35}
    assert bench.cell_options(p, bench.Cell("sb-wa", 10), "cifar100")[1].method_options["rho"] == 1.15
    assert bench.cell_options(p, bench.Cell("sb-wa", 10), "folder")[1].method_options["rho"] == 1.0


def test_markdown_puts_the_papers_numbers_beside_tiny_imagenet():
    cell = {"avg_2_to_T": 12.5, "avg_1_to_T": 20.0, "last": 10.0}
    budget = {"run": {"arch": "resnet18", "width": 0.25, "train": {"epochs": 2, "batch_size": 64, "lr": 0.1},
                      "memory": 200, "selection": "random", "seed": 0},
              "sequence": {"source": "tiny.zip", "classes": 20, "image_size": 32, "order_seed": 0}}
    table = {"dataset": "tiny-imagenet", "task_counts": [2, 5], "budget": budget,
             "methods": [{"name": "std-wa", "label": "STD + WA", "cells": {"2": cell}}],
             "paper": bench.paper_numbers("tiny-imagenet", ("std-wa",), (2, 5))}
    md = bench.table_markdown(table)
    assert "| STD + WA | 12.50 | – |" in md
    assert "| STD + WA | 57.96 | 55.97 |" in md
    assert "classes 20, image size 32" in md


def test_cli_bench_prints_the_table(colors, tmp_path):
    out = tmp_path / "cli-grid"
    args = ["bench", str(colors["train"]), "--test", str(colors["test"]), "--image-size", "16", "--methods", "finetune",
            "--tasks", "2", "--width", "0.125", "--epochs", "1", "--batch-size", "16", "--memory", "8",
            "--device", "cpu", "--no-plots", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| Fine-tuning |" in result.output and (out / "table.json").is_file()
    assert not (out / "accuracy_per_step.png").exists()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "skipped 1 finished" in again.output


def test_cli_default_rows_are_the_papers_seven():
    from sbcli.cli.bench import build_plan

    assert len(bench.PAPER_ORDER) == 7 and all(m in bench.BENCH_METHODS for m in bench.PAPER_ORDER)
    plan = build_plan(None)
    assert plan.methods == bench.PAPER_ORDER
    shown = " ".join(CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "300"}).output.split())
    assert ",".join(bench.PAPER_ORDER) in shown
    assert [bench.BENCH_METHODS.get(m).label for m in bench.PAPER_ORDER][-2:] == ["S&B + WA", "Oracle (joint)"]


def test_cli_bench_precision_is_part_of_the_budget_and_compile_is_not(colors, tmp_path):
    out = tmp_path / "fp32-grid"
    args = ["bench", str(colors["train"]), "--test", str(colors["test"]), "--image-size", "16", "--methods", "std-wa",
            "--tasks", "2", "--width", "0.125", "--epochs", "1", "--batch-size", "16", "--memory", "8",
            "--device", "cpu", "--no-plots", "--out", str(out), "--precision", "fp32"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    history = read_state(out / "cells" / "std-wa-T2").history
    assert {p["precision"] for h in history for p in h.phases} == {"fp32"}
    assert json.loads((out / "bench.json").read_text())["run"]["train"]["precision"] == "fp32"
    resumed = CliRunner().invoke(app, [*args, "--compile"])
    assert resumed.exit_code == 0 and "skipped 1 finished" in resumed.output
    other = CliRunner().invoke(app, [*args[:-1], "bf16"])
    assert other.exit_code == 1 and "run.train.precision" in other.output


def test_rules_in_the_weights_record_no_second_accuracy(finished):
    out, _ = finished
    table = json.loads((out / "table.json").read_text())
    assert all("network" not in row["cells"]["2"] for row in table["methods"])  # finetune, std-wa: the network is the rule


def test_std_icarl_cells_show_the_network_output_beside_the_nearest_mean():
    def step(rule: float, network: float, classes: int) -> StepRecord:
        metrics = StepMetrics(rule, [rule], rule, rule, rule, rule)
        return StepRecord(classes // 2, classes, metrics, dataclasses.replace(metrics, overall=network, per_task=[network]))

    cell = bench.cell_summary([step(80.0, 70.0, 2), step(60.0, 40.0, 4)])
    assert (cell["avg_2_to_T"], cell["network"]["avg_2_to_T"]) == (60.0, 40.0)
    assert (cell["avg_1_to_T"], cell["network"]["avg_1_to_T"]) == (70.0, 55.0)
    assert cell["network"]["accuracy"] == [70.0, 40.0]
    budget = {"run": {"arch": "resnet18", "width": 1.0, "train": {"epochs": 1, "batch_size": 8, "lr": 0.1}, "memory": 8,
                      "selection": "random", "seed": 0},
              "sequence": {"source": "x", "classes": None, "image_size": None, "order_seed": 0}}
    table = {"task_counts": [2], "budget": budget, "paper": None,
             "methods": [{"name": "std-icarl", "label": "STD + iCaRL", "cells": {"2": cell}}]}
    md = bench.table_markdown(table)
    assert "| STD + iCaRL | 60.00 |" in md and "| STD + iCaRL, network output | 40.00 |" in md


def test_bench_says_what_each_row_runs_before_it_starts(colors):
    p = plan(colors, methods=("std-wa", "sb-wa", "dd-wa"), tasks=(2, 5), epochs=4)
    p = dataclasses.replace(p, seq=dataclasses.replace(p.seq, order_seed=None))
    lines = bench.describe(p, "folder")
    assert "class order as in the dataset (--order-seed -1)" in lines[0] and "seed None" not in lines[0]
    assert "threads" in lines[0] and ("(bf16 on cpu)" in lines[0] or "(fp32 on cpu)" in lines[0])
    assert lines[1] == "  std-wa: epochs per step T2: 4×2; T5: 4×5"
    # step 2 of 2: bf = 1/2, split (A+B+C); 5 tasks: split at every later step with rho 1
    assert lines[2] == ("  sb-wa: epochs per step T2: 4, 12, rho 1 (the paper gives none here; --rho sets it); "
                        "T5: 4, 12×4, rho 1 (the paper gives none here; --rho sets it)")
    assert lines[3] == "  dd-wa: epochs per step T2: 4, 8; T5: 4, 8×4"


def test_markdown_says_what_ran_per_cell(finished):
    out, result = finished
    md = (out / "table.md").read_text()
    assert "## What ran" in md and "| Fine-tuning | 2 | 1×2 | – | " in md
    assert "class order seed 0" in md and "threads)" in md
    cell = result.table["methods"][1]["cells"]["2"]
    assert cell["epochs_per_step"] == [1, 1] and cell["rho"] is None and cell["precision"] in (["bf16"], ["fp32"])
