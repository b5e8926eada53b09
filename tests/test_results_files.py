"""history.csv and accuracy.png beside a learner: written from its history, without touching the caller's matplotlib."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]


def test_drawing_accuracy_png_leaves_the_process_backend_as_it_was(tmp_path):
    # in a fresh interpreter: a notebook-like process whose backend is not Agg, then one learner's figures
    script = textwrap.dedent(f"""
        import matplotlib
        matplotlib.use("svg")
        from sbcli.learner.records import StepRecord
        from sbcli.metrics import StepMetrics
        from sbcli.run.results import write_results

        class State:
            method, num_classes, steps = "std", 4, 2
            history = [StepRecord(1, 2, StepMetrics(90.0, [90.0], 90.0, float("nan"), 90.0, float("nan"))),
                       StepRecord(2, 4, StepMetrics(70.0, [60.0, 80.0], 60.0, 80.0, 65.0, 85.0))]

        written = write_results(State(), r"{tmp_path}")
        print(matplotlib.get_backend(), *sorted(p.name for p in written))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "MPLBACKEND": ""})
    assert out.stdout.split() == ["svg", "accuracy.png", "history.csv"]
    assert (tmp_path / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
