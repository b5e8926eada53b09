"""The prepared GPU check and paper comparison (benchmarks/gpu_check.py, paper_compare.py), run here at tiny sizes.

The dry run goes through every step the GPU machine will run (environment, ``pytest -m gpu``, the
engine benchmark, the profile, the three-row comparison with its CPU evaluation) and must leave
a small results folder: at most 8 plainly named files, easy to copy off the GPU machine. The planning (epochs that fit
a budget, which steps split) and the tables are checked on their own.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the script loads
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pc():
    return load("paper_compare")


@pytest.fixture(scope="module")
def report_mod():
    return load("compare_report")


# ----------------------------------------------------------------------------------------------
# The whole check, dry
# ----------------------------------------------------------------------------------------------


def test_the_dry_check_runs_every_step_into_the_out_folder(tmp_path, report_mod):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "SBCLI_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "--dry", "--out", str(out), "--work",
                           str(tmp_path / "work")], capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files), files
    assert {"results.json", "results.md", "log.txt", "learner-sb-wa.json", "learner-std-wa.json",
            "learner-std-wa-equal.json"} <= set(files)
    r = json.loads((out / "results.json").read_text())
    assert not r.get("errors") and r["env"]["missing"] == [] and r["env"]["sbcli_help"] == "ok"
    assert r["tests"]["exit_code"] == 0 and r["tests"]["counts"]["failures"] == 0
    assert r["tests"]["counts"]["skipped"] > 0 and any("no CUDA GPU" in k for k in r["tests"]["skip_reasons"])
    names = [row["name"] for row in r["bench"]["rows"]]
    assert names[1:] == [names[0] + " no teacher", names[0] + " eager", names[0] + " no teacher eager", "reference"]
    assert r["bench"]["meets_target"] is False and r["profile"]["top"]  # the CPU misses it: the profile ran
    assert (r["bench"]["batch_size"], r["bench512"]["batch_size"]) == (256, 512)  # both batch sizes, the same rows
    assert [row["name"] for row in r["bench512"]["rows"]] == names and r["bench"]["without_teacher_img_s"] > 0
    assert r["ddp"]["passed"] and r["ddp"]["torchrun_exit"] == 0 and r["ddp"]["steps_after_add_task"] == 3
    seq = r["sequence"]
    assert list(seq["rows"]) == ["sb-wa", "std-wa", "std-wa-equal"] and all(s["steps"] == 3 for s in seq["rows"].values())
    assert seq["rows"]["std-wa-equal"]["epochs_per_step"] == seq["rows"]["sb-wa"]["epochs_per_step"] == [1, 3, 3]
    assert seq["rows"]["std-wa"]["epochs_per_step"] == [1, 1, 1]
    assert [a["step"] for a in seq["ablation"]] == [2, 3] and seq["cpu_evaluation"]["same"] is True
    history = json.loads((out / "learner-sb-wa.json").read_text())["history"]
    assert [h["metrics"]["overall"] for h in history] == seq["rows"]["sb-wa"]["accuracy"]
    md = (out / "results.md").read_text()
    for heading in ("## pytest -m gpu", "## Engine throughput, batch 256", "## Engine throughput, batch 512", "## Profile", "## DDP", "## Average incremental accuracy",
                    "## S&B ablation", "## S&B minus STD"):
        assert heading in md, heading
    # the tables print again from what came back, without the learners
    again = subprocess.run([sys.executable, str(BENCHMARKS / "compare_report.py"), str(out)], capture_output=True,
                           text=True, check=True, env=env).stdout
    assert again.rstrip("\n") == report_mod.report_markdown(seq).rstrip("\n")


# ----------------------------------------------------------------------------------------------
# Planning
# ----------------------------------------------------------------------------------------------


def test_step_sizes_and_splits_of_the_paper_shaped_run(pc):
    order = list(range(100))
    assert pc.step_images([500] * 100, order, 10, 2000) == [5000] + [7000] * 9
    assert pc.step_images([500] * 100, order, 10, 20_000) == [5000 + min(20_000, 5000 * t) for t in range(10)]
    split = pc.split_steps(10, 10, 1.15, 1.0)  # rho 1.15: steps 2-7 split, 8-10 have bf = 1
    assert split == [False] + [True] * 6 + [False] * 3
    cost = pc.row_image_epochs(pc.step_images([500] * 100, order, 10, 2000), split)
    assert cost == {"sb-wa": 5000 + 6 * 3 * 7000 + 3 * 7000, "std-wa": 5000 + 9 * 7000, "std-wa-equal": 152_000}


def config(pc, **kw):
    return pc.CompareConfig(train=Path("t"), test=Path("v"), out=Path("o"), **{"overhead_s_per_step": 0.0, **kw})


def test_epochs_fill_the_budget_and_the_control_joins_only_when_it_fits(pc):
    cost = {"sb-wa": 152_000, "std-wa": 68_000, "std-wa-equal": 152_000}
    # 40,000 img/s for 300 s: 12M images; three rows cost 372,000 an epoch: 32 epochs
    assert pc.fit_epochs(config(pc), 40_000, cost, 300) == (32, ["sb-wa", "std-wa", "std-wa-equal"])
    # 10,000 img/s: three rows would get 8 epochs (< 10): two rows, 13 epochs (220,000 an epoch)
    assert pc.fit_epochs(config(pc), 10_000, cost, 300) == (13, ["sb-wa", "std-wa"])
    assert pc.fit_epochs(config(pc, control="yes"), 10_000, cost, 300) == (8, ["sb-wa", "std-wa", "std-wa-equal"])
    assert pc.fit_epochs(config(pc, control="no"), 40_000, cost, 300)[1] == ["sb-wa", "std-wa"]
    assert pc.fit_epochs(config(pc, epochs=5), 40_000, cost, 300)[0] == 5
    assert pc.fit_epochs(config(pc), 1e9, cost, 300)[0] == 200  # the paper's 200 at most
    assert pc.fit_epochs(config(pc), 1.0, cost, 300)[0] == 1  # at least one
    overhead = config(pc, overhead_s_per_step=10.0)  # 10 steps x 10 s per row come off the budget
    assert pc.fit_epochs(overhead, 40_000, cost, 300 + 300) == (32, ["sb-wa", "std-wa", "std-wa-equal"])
    sb_only = config(pc, main_rows=("sb-wa",), control="no")
    assert pc.fit_epochs(sb_only, 40_000, cost, 300) == (78, ["sb-wa"])


def test_without_a_budget_every_row_trains_the_default_epochs(pc):
    cost = {"sb-wa": 152_000, "std-wa": 68_000, "std-wa-equal": 152_000}
    inf = float("inf")
    assert pc.fit_epochs(config(pc), 1.0, cost, inf) == (pc.DEFAULT_EPOCHS, ["sb-wa", "std-wa", "std-wa-equal"])
    assert pc.fit_epochs(config(pc, epochs=40, control="no"), 1.0, cost, inf) == (40, ["sb-wa", "std-wa"])
    assert config(pc).budget_s is None and pc.DEFAULT_EPOCHS >= 30  # the question asks for 30 epochs a phase at least


# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------


def history(accuracies: list[float], sb: bool = False) -> list[dict]:
    steps = []
    for t, acc in enumerate(accuracies):
        metrics = {"overall": acc, "old": acc - 5, "new": acc + 5, "intra_old": acc + 1, "intra_new": acc + 2}
        record = {"partition": {"is_split": t < 2}, "after_B": {"overall": acc - 3} if t < 2 else None,
                  "after_C": {"overall": acc - 1}} if sb and t else {}
        record = {k: v for k, v in record.items() if v is not None}
        phases = [{"name": n, "epochs": 2, "seconds": 1.0, "images_per_s": 100.0} for n in
                  (("A", "B", "C") if sb and t and t < 2 else ("x",))]
        steps.append({"step": t + 1, "num_classes": 2 * (t + 1), "metrics": metrics, "phases": phases, "record": record,
                      "seconds": 3.0})
    return steps


def test_the_report_computes_averages_differences_and_the_ablation(tmp_path, report_mod):
    for row, hist in (("sb-wa", history([80.0, 70.0, 60.0], sb=True)), ("std-wa", history([80.0, 66.0, 55.0])),
                      ("std-wa-equal", history([80.0, 69.0]))):  # the control stopped after two steps
        (tmp_path / f"learner-{row}.json").write_text(json.dumps({"history": hist}))
    cfg = {"tasks": 3, "train": "x/tiny/train", "width": 1.0, "budget_s": 60.0, "batch_size": 256, "lr": 0.1,
           "memory": 2000, "rho": 1.15, "order_seed": 0, "seed": 0}
    plan = {"epochs": 2, "rows": ["sb-wa", "std-wa", "std-wa-equal"], "calibration": {"device": "GPU", "torch": "9"}}
    report = report_mod.build_report(cfg, plan, tmp_path, {"stopped": "stopped at the time budget"})
    sb = report["rows"]["sb-wa"]
    assert sb["avg_2_to_T"] == 65.0 and sb["avg_1_to_T"] == 70.0 and sb["last"] == 60.0
    assert sb["epochs_per_step"] == [2, 6, 2]
    assert report["difference_2_to_T"] == {"S&B - STD + WA": pytest.approx(65.0 - 60.5)}  # the partial row is left out
    first, second = report["ablation"]
    assert first == {"step": 2, "split": True, "after_B": 67.0, "after_C": 69.0, "after_WA": 70.0}
    assert math.isnan(second["after_B"])  # an unsplit step has no phase B
    assert {k: v for k, v in second.items() if k != "after_B"} == {"step": 3, "split": False, "after_C": 59.0,
                                                                   "after_WA": 60.0}
    assert report["paper_difference_2_to_T"]["CIFAR-100, 10 tasks of 10 classes, 32 px"] == pytest.approx(3.25)
    md = report_mod.report_markdown(report)
    assert "| S&B - STD + WA (this run) | +4.50 |" in md and "+3.25" in md and "stopped at the time budget" in md
    assert "| STD + WA, S&B's epochs per step | 80.00 | 69.00 | – |" in md
    assert "| 2 | yes | 67.00 | 69.00 | 70.00 |" in md and "| 3 | no (bf = 1) | – | 59.00 | 60.00 |" in md


def test_junit_summary_counts_failures_and_groups_skip_reasons(tmp_path):
    gc = load("gpu_check")
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite tests="4" failures="1" errors="0" skipped="2">'
                   '<testcase classname="t" name="a"/>'
                   '<testcase classname="t" name="b"><failure message="boom"/></testcase>'
                   '<testcase classname="t" name="c"><skipped message="no GPU"/></testcase>'
                   '<testcase classname="t" name="d"><skipped message="no GPU"/></testcase>'
                   '</testsuite></testsuites>')
    summary = gc.junit_summary(xml)
    assert summary["counts"] == {"tests": 4, "failures": 1, "errors": 0, "skipped": 2, "passed": 1}
    assert summary["failed"] == [{"test": "t::b", "message": "boom"}] and summary["skip_reasons"] == {"no GPU": 2}


def test_copy_size_counts_what_a_copy_of_the_checkout_holds(tmp_path):
    gd = load("gpu_data")
    run = lambda *cmd: subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True)
    run("git", "init", "-q")
    (tmp_path / ".gitignore").write_text("/.gpu-data/\n/runs/\n")
    (tmp_path / "tracked.bin").write_bytes(b"x" * 2**20)
    run("git", "add", "tracked.bin", ".gitignore")
    (tmp_path / "untracked.bin").write_bytes(b"y" * 2**20)  # not ignored: it is copied too
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "big.bin").write_bytes(b"z" * 5 * 2**20)  # ignored, not carried: stays here
    (tmp_path / ".gpu-data").mkdir()
    (tmp_path / ".gpu-data" / "data.zip").write_bytes(b"d" * 3 * 2**20)
    size = gd.copy_size(tmp_path, [".gpu-data", ".whl"])
    assert size["tree_mib"] == 2.0 and size["carried_mib"] == {".gpu-data": 3.0, ".whl": 0.0}
    assert size["total_mib"] == 5.0 and size["fits"] is True
    assert gd.copy_size(tmp_path, [".gpu-data"], max_mib=4)["fits"] is False


def test_the_gpu_benchmark_is_the_issues_configuration(tmp_path):
    gc = load("gpu_check")
    cfg = gc.CheckConfig(out=tmp_path, data=tmp_path / "d.zip", work=tmp_path)
    args = gc.bench_args(cfg, tmp_path / "speed.json")
    pairs = dict(zip(args[2::2], args[3::2], strict=False))
    assert args[1] == "benchmarks/engine_speed.py" and "--without-teacher" in args
    assert {k: pairs[k] for k in ("--device", "--width", "--batch-size", "--image-size", "--precision")} == {
        "--device": "cuda", "--width": "1.0", "--batch-size": "256", "--image-size": "32", "--precision": "auto"}
    parsed = gc.parse(["--out", str(tmp_path)])
    assert parsed.sequence == "compare" and parsed.budget_s is None  # the real run, in full, is the default
    assert parsed.seed == 0 and gc.parse(["--seed", "1"]).seed == 1  # a second seed is one option
    with pytest.raises(SystemExit):
        gc.parse(["--skip", "benchmark"])  # a misspelt step is refused, not silently run


def test_the_rows_train_with_the_papers_optimiser_and_schedule(pc, tmp_path):
    seq, run = pc.options(config(pc, width=1.0), 30)
    t = run.train
    assert (t.epochs, t.batch_size, t.lr, t.momentum, t.weight_decay, t.milestones, t.lr_decay) == (
        30, 256, 0.1, 0.9, 5e-4, (0.3, 0.6, 0.8), 0.1)
    assert getattr(t, "warmup_epochs", 0.0) == 0.0 and getattr(t, "val_fraction", 0.0) == 0.0
    assert (run.arch, run.width, run.memory, run.selection, seq.order_seed, seq.image_size) == (
        "resnet18", 1.0, 2000, "random", 0, 32)
    assert config(pc).rho == 1.15 and config(pc).tasks == 10
    assert pc.options(config(pc, seed=1), 30)[1].seed == 1  # --seed 1: the second seed the issue asks for


def test_results_md_renders_a_gpu_run(report_mod):
    gr = load("gpu_check_report")
    bench = {"hardware": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "command": "engine_speed.py ...", "exit_code": 0,
             "rows": [{"name": "engine auto (bf16)", "img_s": 45_000.0, "x_reference": 12.5},
                      {"name": "engine auto (bf16) no teacher", "img_s": 60_000.0, "x_reference": 16.7},
                      {"name": "reference", "img_s": 3_600.0, "x_reference": 1.0}],
             "with_teacher_img_s": 45_000.0, "meets_target": True,
             "paper_cifar100_10_tasks_hours": {"engine auto (bf16)": 0.19, "reference": 2.35}}
    results = {"env": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}], "torch": "2.11.0", "cuda": "13.0", "cudnn": 91000,
                       "nccl": "(2, 27, 3)", "python": "3.12.3", "cpus": 16, "missing": [], "webp": True,
                       "sbcli_help": "ok"},
               "tests": {"exit_code": 1, "seconds": 95.0, "counts": {"passed": 14, "failures": 1, "errors": 0, "skipped": 1},
                         "failed": [{"test": "tests.test_gpu::test_x[cuda]", "message": "boom"}],
                         "skip_reasons": {"DDP over NCCL needs two GPUs": 1}},
               "bench": bench, "compile": {**bench, "command": "engine_speed.py --compile"},
               "profile": {"batches": 20, "batch_size": 256, "images_per_s": 40_000.0, "gpu_busy_fraction": 0.85,
                           "sort": "device_time_total", "top": [{"op": "aten::cudnn_convolution", "total_ms": 50.0,
                                                                 "self_ms": 50.0, "calls": 600}]},
               "sequence": {"skipped": "only 60 s left of the check's budget"}, "elapsed_s": 530.0}
    md = gr.markdown(results)
    assert md.startswith("# sbcli GPU check\n\nNVIDIA H100 80GB HBM3 · torch 2.11.0")
    assert "14 passed, 1 failed" in md and "- FAILED tests.test_gpu::test_x[cuda]: boom" in md
    assert "| engine auto (bf16) | 45,000 | 12.5x | nan |" in md and "meets the target" in md
    assert "## Engine throughput with --compile" in md and "GPU busy 85 % of the wall time" in md
    assert "only 60 s left" in md and md.rstrip().endswith("Total 530.0 s.")


def test_step_flops_count_a_teacher_as_one_more_forward():
    gc = load("gpu_check")
    f = gc.step_flops(0.125, 16, 4)
    assert f["with_teacher_gflop"] == pytest.approx(f["no_teacher_gflop"] + f["forward_gflop"])
    assert 2.5 < f["no_teacher_gflop"] / f["forward_gflop"] < 3.5  # a backward costs about two forwards
    wide = gc.step_flops(0.25, 16, 4)["forward_gflop"]
    assert 3.5 < wide / f["forward_gflop"] < 4.5  # twice the width: about four times the convolution FLOPs
