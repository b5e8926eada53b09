"""A mistyped path is answered before torch is imported: one sentence, exit 1, in well under a second."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ZOO_LEARNER = Path(__file__).resolve().parents[1] / "zoo" / "learners" / "demo-sb-tiny"
# Runs the CLI as `sb` does, then says on the last stderr line whether torch (or onnxruntime) was imported.
PROBE = """
import sys
from sbcli.cli.app import main
sys.argv = ["sb", *sys.argv[1:]]
try:
    main()
except SystemExit as done:
    code = done.code
heavy = sorted(m for m in ("torch", "onnxruntime", "torchvision") if m in sys.modules)
print(f"exit={code} heavy={','.join(heavy) or 'none'}", file=sys.stderr)
"""


def run_probe(*args: str) -> tuple[str, str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    seconds = time.perf_counter() - start
    *said, last = done.stderr.strip().splitlines()
    return last, " ".join(" ".join(said).split()), seconds


@pytest.mark.parametrize(("args", "sentence"), [
    (["evaluate", "runs/typo"], "No learner at runs/typo"),
    (["evaluate", str(ZOO_LEARNER), "typo-holdout"], "The test folder typo-holdout does not exist"),
    (["add-task", "typo", "new/train"], "No learner at typo"),
    (["add-task", str(ZOO_LEARNER), "typo/train"], "The folder typo/train does not exist"),
    (["add-task", str(ZOO_LEARNER), str(ZOO_LEARNER), "--test", "typo/test"], "The test folder typo/test does not exist"),
    (["export", "typo"], "No learner at typo"),
    (["export", "typo", "--to-hub", "me/x"], "No learner at typo"),
    (["rollback", "typo", "1"], "No learner at typo"),
    (["predict", "typo", "photo.jpg"], "typo is neither a learner directory"),
    (["predict", str(ZOO_LEARNER), "typo.jpg"], "typo.jpg does not exist"),
    (["serve", "typo.onnx"], "typo.onnx is neither a learner directory"),
    (["train", "./photos-typo"], "./photos-typo is neither a benchmark"),
    (["train", "--test", "typo/test"], "The test folder typo/test does not exist"),
])
def test_a_mistyped_path_is_answered_before_torch_loads(args: list[str], sentence: str) -> None:
    last, said, seconds = run_probe(*args)
    assert last == "exit=1 heavy=none", (last, said)
    assert said.startswith("Error: ") and sentence in said and "Traceback" not in said
    assert seconds < 10  # generous for a loaded machine; torch alone takes seconds to import


def test_the_probe_sees_torch_when_a_command_imports_it() -> None:
    last, _, _ = run_probe("version")
    assert last == "exit=0 heavy=torch"  # `sb version` names torch's version: the probe can tell
