"""The own-data GPU runs (benchmarks/own_data_gpu.py), here at tiny sizes: the pretrain -> push to the
local Hub -> ``--pretrained`` chain through `sb` itself, the pool's dependencies and budget, the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"


def test_the_dry_run_pushes_a_pretrained_backbone_and_a_run_starts_from_it(tmp_path: Path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(BENCHMARKS / "own_data_gpu.py"), "--dry", "--out", str(out), "--work",
                           str(work), "--workers", "2", "--threads", "1", "--names",
                           "^(pretrain|push|cifar-pretrained-s0|retain-sb-balance-s0)$"],
                          check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {r["name"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert {n: r["status"] for n, r in runs.items()} == dict.fromkeys(
        ("pretrain", "push", "cifar-pretrained-s0", "retain-sb-balance-s0"), "ok")
    pretrained = runs["cifar-pretrained-s0"]["pretrained"]
    assert pretrained["source"] == "hub" and pretrained["repo"] == "sbcli-bench/tiny-imagenet-100-resnet18"
    assert len(runs["cifar-pretrained-s0"]["steps"]) == 5
    assert [p["name"] for p in runs["retain-sb-balance-s0"]["steps"][1]["phases"]] == ["A", "B", "C", "balance"]
    report = subprocess.run([sys.executable, str(BENCHMARKS / "own_data_report.py"), "--per-seed", str(out / "results.jsonl")],
                            check=False, capture_output=True, text=True, timeout=60)
    assert report.returncode == 0 and "### cifar" in report.stdout and "| pretrained | 0 |" in report.stdout
    assert "| cifar-pretrained-s0 |" in report.stdout  # --per-seed: one row a run


def test_the_pool_skips_what_depends_on_a_failure_and_what_the_budget_cannot_hold(tmp_path: Path):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from own_data_gpu import Pool
        from own_data_jobs import Job
    finally:
        sys.path.remove(str(BENCHMARKS))
    fail = Job("a", "g", ["-c", "raise SystemExit(3)"])
    after = Job("b", "g", ["-c", "print('never')"], after="a")
    ok = Job("c", "g", ["-c", "print('fine')"])
    pool = Pool([fail, after, ok], workers=2, budget_s=60, min_start_s=0, out=tmp_path, work=tmp_path,
                env=dict(os.environ))
    pool.run()
    assert pool.status == {"a": "failed", "b": "skipped", "c": "ok"}
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert next(x for x in lines if x["name"] == "b")["why"] == "dependency failed"

    slow = Job("slow", "g", ["-c", "import time; time.sleep(30)"])
    late = Job("late", "g", ["-c", "print(1)"])
    pool = Pool([slow, late], workers=1, budget_s=2, min_start_s=1.5, out=tmp_path / "x", work=tmp_path,
                env=dict(os.environ))
    (tmp_path / "x").mkdir()
    start = time.monotonic()
    pool.run()
    assert time.monotonic() - start < 10  # the budget's end stops what still runs
    assert pool.status == {"slow": "killed", "late": "skipped"}

    unlimited = Pool([Job("d", "g", ["-c", "print('fine')"])], workers=1, budget_s=None, min_start_s=1e9,
                     out=tmp_path / "y", work=tmp_path, env=dict(os.environ))
    (tmp_path / "y").mkdir()
    unlimited.run()
    assert unlimited.status == {"d": "ok"}  # no budget: no start is too late
