"""The own-data defaults (sbcli.config.options) and the benchmark that chose them (benchmarks/own_data_defaults.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sbcli.config.options import bench_defaults, build_options
from sbcli.errors import ConfigError
from sbcli.methods.base import build_config

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"


def _opts(**given):
    _, run, _ = build_options({"source": "./photos", "pretrained": "none", **given})  # a folder from scratch
    return run, {k: v for k, v in run.method_options.items() if v is not None}


def test_a_folder_defaults_to_std_with_wa_clipping_in_every_step():
    run, method = _opts()
    assert run.method == "std" and method == {"wa_clip": True}  # the step-1 head rules: std's own default, on
    assert build_config("std", run.method_options).first_task_rules is True
    assert run.train.lr == 0.01 and run.train.warmup_epochs == 0.0  # below lr 0.05: no warm-up
    assert _opts(lr=0.1)[0].train.warmup_epochs == 1.0  # asked for lr 0.1: one epoch of warm-up


def test_the_warm_up_follows_the_lr_unless_given():
    assert _opts(lr=0.01)[0].train.warmup_epochs == 0.0
    assert _opts(lr=0.01, warmup_epochs=2.0)[0].train.warmup_epochs == 2.0
    assert _opts(lr=0.1, warmup_epochs=0.0)[0].train.warmup_epochs == 0.0


def test_icarl_and_bic_never_clamp_unless_asked():
    for inference in ("icarl", "bic"):
        assert _opts(inference=inference)[1] == {"first_task_rules": False, "inference": inference}
    assert _opts(inference="icarl", first_task_rules=True)[1]["first_task_rules"] is True
    with pytest.raises(ConfigError, match="--wa-clip"):  # asked for where it cannot apply: refused, not dropped
        build_config("std", _opts(inference="icarl", wa_clip=True)[0].method_options)


def test_a_default_option_the_method_does_not_take_is_dropped_an_asked_one_refused():
    assert _opts(method="sb")[1] == {}
    assert _opts(method="std", inference="none")[1] == {"inference": "none"}
    with pytest.raises(ConfigError, match="does not apply to --method sb"):
        build_config("sb", _opts(method="sb", wa_clip=True)[0].method_options)


def test_the_paper_sources_and_sb_bench_keep_the_authors_behaviour():
    _, run, _ = build_options({"source": "cifar100", "inference": "icarl", "method": "std"})
    assert run.method == "std" and run.method_options["first_task_rules"] is None  # the method's own default: on
    assert not run.method_options["wa_clip"]  # off: the table's value, the method's own default
    assert not bench_defaults("cifar100").get("wa_clip") and not bench_defaults("demo").get("wa_clip")
    assert "first_task_rules" not in bench_defaults("demo")


def test_sb_phases_cost_what_one_std_step_costs():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from own_data_defaults import CONFIGS, STUDIES, VARIANTS, sb_phases
    finally:
        sys.path.remove(str(BENCHMARKS))
    for epochs in (1, 2, 5, 10, 30):
        parts = list(map(int, sb_phases(epochs).split(",")))
        assert min(parts) >= 1 and (sum(parts) == epochs or epochs < 3)
    assert sb_phases(10) == "4,3,3"
    for configs, variants, seeds in STUDIES.values():
        assert set(configs) <= set(CONFIGS) and set(variants) <= set(VARIANTS) and len(seeds) >= 3


def test_the_dry_benchmark_runs_records_reports_and_does_not_rerun(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(BENCHMARKS / "own_data_defaults.py"), "--dry", "--study", "collapse", "--work",
           str(tmp_path), "--names", "^c5-0-first-rules-warm0-s0$"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(x["name"], x["status"]) for x in lines] == [("c5-0-first-rules-warm0-s0", "ok")]
    assert "--first-task-rules" in lines[0]["command"] and "--warmup-epochs 0" in lines[0]["command"]
    assert "### first task alone" in done.stdout and "| first-rules-warm0 | 1 |" in done.stdout
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0 and "0 runs to go" in again.stderr
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 1


def test_the_report_sets_each_variant_against_the_first_on_the_same_seeds(tmp_path: Path):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from own_data_defaults_report import report
    finally:
        sys.path.remove(str(BENCHMARKS))

    def run(variant: str, seed: int, accs: list[float], old2: float) -> dict:
        steps = [{"classes": 5 * (i + 1), "overall": a, "old": None if i == 0 else old2, "new": a,
                  "intra_old": None, "wa_factor": None if i == 0 else 0.9} for i, a in enumerate(accs)]
        return {"name": f"t20-{variant}-s{seed}", "config": "t20", "variant": variant, "seed": seed, "tasks": 3,
                "status": "ok", "steps": steps}

    lines = [run("a", 0, [40, 30, 20], 10), run("a", 1, [42, 32, 22], 12), run("b", 0, [40, 33, 26], 15),
             run("b", 2, [40, 33, 26], 15)]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    text = report(path, [(("t20",), ("a", "b"), (0, 1, 2))])
    assert "| a | 0,1 | 31.0 (30.0-32.0) | 26.0 (25.0-27.0) |" in text
    assert "| b | 0 | 3.0 | 4.5 | 6.0 | 5.0 | 0.0 |" in text  # seed 0 alone is paired
