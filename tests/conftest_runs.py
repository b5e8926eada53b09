"""A learner grown the way a person does it, in subprocesses (stderr is a pipe, not a terminal).

`sb train` without `--out` (so into runs/train), 2 tasks, then `sb add-task --quiet`, both with
`--json` and with every experiment log whose extra is installed; the run's folder is its own cwd.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SMALL = ["--pretrained", "none", "--width", "0.125", "--epochs", "1", "--batch-size", "16", "--memory", "8", "--device", "cpu",
         "--image-size", "16", "--precision", "fp32"]
LOGS = [kind for kind in ("tensorboard", "mlflow") if importlib.util.find_spec(kind) is not None]


def sb(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    paths = [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]  # this checkout's sbcli
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in paths if p))
    res = subprocess.run([sys.executable, "-m", "sbcli", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="session")
def grown_run(tmp_path_factory, color_data) -> dict:
    """cwd, learner, and the stdout/stderr of train and add-task (JSON on stdout)."""
    cwd = tmp_path_factory.mktemp("person")
    logs = [arg for kind in LOGS for arg in ("--log", kind)]
    # --method sb and --balance-epochs 2: a folder's defaults are STD + WA without balancing; these runs show
    # S&B's phases, the balancing phase and the ablation table with its +balance column
    train = sb(cwd, "train", color_data["task1_train"], "--test", color_data["task1_test"], "--tasks", 2, "--method", "sb",
               "--balance-epochs", 2, *SMALL, *logs, "--json")
    learner = cwd / json.loads(train.stdout)["learner"]
    add = sb(cwd, "add-task", learner, color_data["task2_train"], "--test", color_data["task2_test"], "--device", "cpu",
             "--quiet", *logs, "--json")
    return {"cwd": cwd, "learner": learner, "train": train, "add": add, "logs": LOGS}
