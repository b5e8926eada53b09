"""What a SIGKILLed export or pull leaves beside its output is removed by the next writer there, only when
sbcli provably made it (its marker names a process that is gone); a Ctrl-C after a save's commit says so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_learner import ZOO_V1, tree
from test_store_cli import invoke

from sbcli.atomic import STAGING_MARKER, remove_orphans, staging

# Runs the real writer in a subprocess, paused (a patched step prints "ready" and sleeps) until the test kills it.
PAUSED = {
    "pull": ("sbcli.hub.pull", "_check_learner", "from sbcli import api; api.pull('demo-sb-tiny', Path(sys.argv[1]))"),
    "triton": ("sbcli.export.triton", "export_onnx",
               "from sbcli import api; api.export_triton(Path(sys.argv[2]), Path(sys.argv[1]).parent)"),
}


def killed_midway(kind: str, target: Path, learner: Path = ZOO_V1) -> None:
    module, function, call = PAUSED[kind]
    script = textwrap.dedent(f"""
        import sys, time, importlib
        from pathlib import Path
        def pause(*args, **kwargs):
            print("ready", flush=True)
            time.sleep(600)
        setattr(importlib.import_module("{module}"), "{function}", pause)
        {call}
    """)
    proc = subprocess.Popen([sys.executable, "-c", script, str(target), str(learner)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"  # the writer is inside its staging folder now
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=300)
    assert proc.returncode == -signal.SIGKILL


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def users_look_alikes(parent: Path, base: str) -> dict[Path, dict[str, str]]:
    """Folders of the user's own named like staging folders: no marker; a marker whose token differs from the
    name's; and a marker of a process that still runs (this test's parent, pid 1: always alive)."""
    plain = parent / f".{base}.pull-4242-0123456789abcdef"
    plain.mkdir()
    (plain / "photo.jpg").write_text("photo")
    forged = parent / f".{base}.pull-4243-0123456789abcdef"
    forged.mkdir()
    (forged / STAGING_MARKER).write_text(json.dumps({"pid": 4243, "token": "fedcba9876543210", "kind": "pull",
                                                     "host": os.uname().nodename}))
    live = parent / f".{base}.triton-1-0123456789abcdef"
    live.mkdir()
    (live / STAGING_MARKER).write_text(json.dumps({"pid": 1, "token": "0123456789abcdef", "kind": "triton",
                                                   "host": os.uname().nodename}))
    return {p: tree(p) for p in (plain, forged, live)}


def test_a_killed_pulls_folder_is_removed_by_the_next_pull_and_a_users_look_alike_survives(tmp_path):
    killed_midway("pull", tmp_path / "first")
    orphans = hidden(tmp_path)
    assert len(orphans) == 1 and orphans[0].startswith(".first.pull-") and not (tmp_path / "first").exists()
    mine = users_look_alikes(tmp_path, "first")
    res = invoke("pull", "demo-sb-tiny", "-o", tmp_path / "second")
    assert res.exit_code == 0, res.output
    assert orphans[0] not in hidden(tmp_path)  # the orphan is gone
    assert {p: tree(p) for p in mine} == mine  # every look-alike as it was


def test_a_killed_triton_exports_folder_is_removed_by_the_next_export(tmp_path):
    repo = tmp_path / "repo"
    learner = tmp_path / "tiny"
    shutil.copytree(ZOO_V1, learner)
    killed_midway("triton", repo / "tiny", learner)
    orphans = hidden(repo)
    assert len(orphans) == 1 and orphans[0].startswith(".tiny.triton-")
    mine = users_look_alikes(repo, "tiny")
    res = invoke("export", learner, "--format", "triton", "-o", repo)
    assert res.exit_code == 0, res.output
    assert orphans[0] not in hidden(repo) and (repo / "tiny" / "config.pbtxt").is_file()
    assert {p: tree(p) for p in mine} == mine


def test_a_staging_folder_is_its_writers_while_it_runs(tmp_path):
    """Another writer beside it (this process's own, or a live one's) never removes it."""
    with staging(tmp_path / "x", "pull") as work:
        work.mkdir()
        (work / "f").write_text("1")
        assert remove_orphans(tmp_path) == [] and (work / "f").read_text() == "1"
    assert list(tmp_path.iterdir()) == []  # and it is gone when the writer ends


@pytest.mark.parametrize(("point", "committed"), [("fsync:steps", False), ("rename:learner.json", True),
                                                  ("delete:dropped-step", True)])
def test_ctrl_c_during_the_save_says_whether_the_step_was_committed(grown_copy, color_data, monkeypatch, point,
                                                                      committed):
    from sbcli.learner.store import commit

    real = commit.checkpoint

    def interrupt(name: str) -> None:
        real(name)
        if name == point:
            raise KeyboardInterrupt

    monkeypatch.setattr(commit, "checkpoint", interrupt)
    res = invoke("add-task", grown_copy, color_data["task2_train"], "--test", color_data["task2_test"],
                 "--device", "cpu", "--keep", "1")
    assert res.exit_code == 130, res.output
    steps = json.loads((grown_copy / "learner.json").read_text())["history"]
    assert len(steps) == (2 if committed else 1)
    if committed:
        last = " ".join(res.stderr.split("Interrupted")[-1].split())
        assert "Interrupted." not in res.stderr and "after the save" in last and "committed" in last
        assert "holds step 2" in last
    else:
        assert res.stderr.splitlines()[-1] == "Interrupted." and "committed" not in res.stderr


@pytest.fixture
def grown_copy(one_task_learner, tmp_path) -> Path:
    target = tmp_path / "L"
    shutil.copytree(one_task_learner, target)
    return target
