"""benchmarks/compare_benches.py: paired per-seed differences between two settings of `sb bench`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compare_benches.py"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare_benches", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_table(directory: Path, values: dict[str, float]) -> str:
    """A finished grid's table.json with one row (S&B + WA) and the given metric per task count."""
    directory.mkdir(parents=True)
    cells = {tasks: {"avg_2_to_T": v} for tasks, v in values.items()}
    table = {"methods": [{"name": "sb-wa", "label": "S&B + WA", "cells": cells}]}
    (directory / "table.json").write_text(json.dumps(table))
    return str(directory)


def test_paired_differences_per_seed_and_their_mean(compare, tmp_path, capsys):
    a = [write_table(tmp_path / f"a{s}", {"2": 40.0 + s, "5": 30.0}) for s in range(2)]
    b = [write_table(tmp_path / f"b{s}", {"2": 41.0 + 2 * s, "5": 29.5}) for s in range(2)]
    compare.main([",".join(a), ",".join(b), "--names", "fp32,bf16"])
    out = capsys.readouterr().out
    assert "| S&B + WA | 2 | fp32 | 40.00 | 41.00 | 40.50 ± 0.71 |" in out
    assert "| S&B + WA | 2 | bf16 - fp32 | +1.00 | +2.00 | 1.50 ± 0.71 |" in out
    assert "| S&B + WA | 5 | bf16 - fp32 | -0.50 | -0.50 | -0.50 ± 0.00 |" in out


def test_unfinished_grid_and_unequal_seed_counts_are_refused(compare, tmp_path):
    a = write_table(tmp_path / "a", {"2": 40.0})
    with pytest.raises(SystemExit, match="does not exist"):
        compare.main([a, str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="one per seed"):
        compare.main([a, f"{a},{a}"])
