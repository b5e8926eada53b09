"""benchmarks/ridge_choice.py: the eigendecomposition and the coarse-to-fine search choose the same ridge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_both_searches_are_timed_and_agree():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ridge_choice.py"), "--images", "200",
                          "--projection", "64", "--classes", "5", "--rounds", "1", "--threads", "1"],
                         capture_output=True, text=True, check=True, env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)
    result = json.loads(out.stdout)
    assert result["same_choice"] and result["eigh_s"] >= 0 and result["coarse_to_fine_s"] >= 0 and result["ridge"] > 0
