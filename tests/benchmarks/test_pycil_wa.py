"""benchmarks/pycil_wa.py: the PyCIL reference run (PyCIL itself is not installed here: its checks and parsing)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from pycil_wa import Curve  # noqa: E402


def test_the_curve_is_read_from_pycils_log_line_in_numpy_2s_repr():
    curve = Curve()
    for msg in ("CNN top1 curve: [np.float64(74.8), np.float64(47.25)]", "CNN top5 curve: [np.float64(99.0)]",
                "no %s here"):
        curve.emit(logging.LogRecord("x", logging.INFO, "f", 1, msg, ("stray", "args"), None))
    assert curve.top1 == [74.8, 47.25]
    curve.emit(logging.LogRecord("x", logging.INFO, "f", 1, "CNN top1 curve: [12.5, 10.0, 7.0]", None, None))
    assert curve.top1 == [12.5, 10.0, 7.0]


def test_a_folder_that_is_not_a_pycil_checkout_is_refused_in_one_line(tmp_path: Path):
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "test").mkdir()
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "pycil_wa.py"), "--pycil", str(tmp_path),
                           "--data", str(tmp_path / "data")], check=False, capture_output=True, text=True)
    assert done.returncode == 2 and "is not a PyCIL checkout" in done.stderr and "Traceback" not in done.stderr
