"""Compute threads: passive OpenMP waiting set before torch loads, `--threads` and SBCLI_THREADS (issue 13, point 7)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from sbcli.threads import prepare, use_threads


def _sb(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "SBCLI_THREADS")}
    base["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run([sys.executable, "-m", "sbcli", *args], check=False, capture_output=True, text=True,
                          env={**base, **env})


def test_prepare_asks_for_passive_waiting_and_keeps_what_the_user_set():
    env: dict[str, str] = {}
    prepare(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
    mine = {"OMP_WAIT_POLICY": "ACTIVE"}
    prepare(mine)
    assert mine["OMP_WAIT_POLICY"] == "ACTIVE"


def test_use_threads_sets_the_environment_and_torch_once_loaded():
    before = torch.get_num_threads()
    env: dict[str, str] = {}
    try:
        use_threads(1, env)
        assert env["OMP_NUM_THREADS"] == "1" and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    use_threads(None, env := {})
    assert env == {}
    with pytest.raises(ValueError, match="between 1 and"):
        use_threads(0, {})


def test_the_entry_point_sets_passive_waiting_before_torch_loads():
    res = _sb("version")
    assert res.returncode == 0, res.stderr
    assert "OpenMP waiting passive" in res.stdout
    assert " CPU threads, " in res.stdout


@pytest.mark.parametrize(("args", "env"), [(("--threads", "1", "version"), {}), (("version",), {"SBCLI_THREADS": "1"})])
def test_threads_from_the_option_or_the_environment(args, env):
    res = _sb(*args, **env)
    assert res.returncode == 0, res.stderr
    assert "(1 CPU threads" in res.stdout


def test_a_bad_thread_count_is_refused_in_one_line():
    res = _sb("--threads", "0", "version")
    assert res.returncode == 2 and "Traceback" not in res.stderr and "--threads" in res.stderr
