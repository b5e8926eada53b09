"""Compute threads: passive OpenMP waiting, after a brief spin, is set before torch loads."""

from __future__ import annotations

import os
import subprocess
import sys

from sbcli.engine.threads import prepare


def _sb(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                         "SBCLI_THREADS")}
    base["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run([sys.executable, "-m", "sbcli", *args], check=False, capture_output=True, text=True,
                          env={**base, **env})


def test_prepare_asks_for_passive_waiting_and_keeps_what_the_user_set():
    env: dict[str, str] = {}
    prepare(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0", "GOMP_SPINCOUNT": "10000"}
    mine = {"OMP_WAIT_POLICY": "ACTIVE"}
    prepare(mine)
    assert mine == {"OMP_WAIT_POLICY": "ACTIVE", "KMP_BLOCKTIME": "0"}  # no spin count overrides the user's policy
    count = {"GOMP_SPINCOUNT": "0"}
    prepare(count)
    assert count["GOMP_SPINCOUNT"] == "0"


def test_the_entry_point_sets_passive_waiting_before_torch_loads():
    res = _sb("version")
    assert res.returncode == 0, res.stderr
    assert "OpenMP waiting passive after 10000 spins" in res.stdout and " CPU threads, " in res.stdout
    mine = _sb("version", OMP_WAIT_POLICY="ACTIVE")
    assert "OpenMP waiting active)" in mine.stdout  # what the user set is kept
