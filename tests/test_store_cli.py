"""The storage rules through the terminal: --step, rollback, --keep, the lock, outputs never clobber inputs."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_learner import ZOO_V1, tree
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.learner.store.lock import writer_lock

runner = CliRunner()
SMALL = ["--pretrained", "none", "--width", "0.125", "--epochs", "1", "--batch-size", "16", "--memory", "8", "--device", "cpu", "--image-size", "16"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def refused(result, *needles: str) -> None:
    """Exit code 1 and one sentence on stderr, no traceback."""
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in " ".join(result.stderr.split()), result.stderr


@pytest.fixture(scope="module")
def grown(color_data, tmp_path_factory) -> Path:
    """A learner of two real steps (red, green; then blue, yellow)."""
    out = tmp_path_factory.mktemp("store-cli") / "grown"
    res = invoke("train", color_data["task1_train"], "--test", color_data["task1_test"], "--out", out, "--method", "std", *SMALL)
    assert res.exit_code == 0, res.output
    res = invoke("add-task", out, color_data["task2_train"], "--test", color_data["task2_test"], "--device", "cpu")
    assert res.exit_code == 0, res.output
    return out


def test_evaluate_an_earlier_step_and_refuse_one_beyond_the_history(grown):
    res = invoke("evaluate", grown, "--step", "1", "--json", "--device", "cpu")
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert result["classes"] == 2 and result["steps"] == 1 and len(result["history"]) == 1
    before = tree(grown)
    refused(invoke("evaluate", grown, "--step", "5", "--device", "cpu"), "Step 5", "not kept (kept steps: 1, 2)")
    assert tree(grown) == before


def test_rollback_through_the_cli_and_its_refusal(grown, tmp_path):
    learner = tmp_path / "l"
    shutil.copytree(grown, learner)
    before = tree(learner)
    refused(invoke("rollback", learner, "7"), "Step 7", "not kept")
    assert tree(learner) == before
    res = invoke("rollback", learner, "1")
    assert res.exit_code == 0, res.output
    assert "is at step 1 again" in res.stdout and "Kept steps: 1, 2" in res.stdout
    assert len(json.loads((learner / "learner.json").read_text())["class_names"]) == 2
    res = invoke("rollback", learner, "2")
    assert res.exit_code == 0, res.output
    assert json.loads((learner / "learner.json").read_text()) == json.loads((grown / "learner.json").read_text())


def test_a_writer_is_refused_while_another_holds_the_learner(grown, tmp_path, color_data):
    learner = tmp_path / "l"
    shutil.copytree(grown, learner)
    before = tree(learner)
    with writer_lock(learner, "add-task"):
        refused(invoke("add-task", learner, color_data["task2_train"], "--device", "cpu"),
                "being written by sb add-task", f"pid {os.getpid()}")
        refused(invoke("rollback", learner, "1"), "being written by")
        refused(invoke("train", color_data["task1_train"], "--out", learner, "--resume", *SMALL), "being written by")
    assert tree(learner) == before


def test_export_never_writes_into_a_learner_onto_a_directory_or_over_a_file(grown, tmp_path):
    before = tree(grown)
    refused(invoke("export", grown, "-o", grown / json.loads((grown / "learner.json").read_text())["files"]["model"]),
            "inside the learner")
    refused(invoke("export", grown, "-o", grown / "model.onnx"), "inside the learner")
    refused(invoke("export", grown, "-o", tmp_path), "is a directory")
    existing = tmp_path / "model.onnx"
    existing.write_bytes(b"keep me")
    refused(invoke("export", grown, "-o", existing), "already exists", "--overwrite")
    assert existing.read_bytes() == b"keep me" and tree(grown) == before


def test_export_an_earlier_step(grown, tmp_path):
    pytest.importorskip("onnxruntime")
    res = invoke("export", grown, "--step", "1", "-o", tmp_path / "s1.onnx", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["onnx"]["num_classes"] == 2


def test_train_and_pull_outputs_are_checked_before_any_work(grown, tmp_path, color_data):
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    refused(invoke("train", color_data["task1_train"], "--out", a_file, *SMALL), "is a file")
    refused(invoke("train", color_data["task1_train"], "--out", grown / "inner", *SMALL), "inside the learner")
    refused(invoke("train", color_data["task1_train"], "--out", grown, *SMALL), "already holds a learner", "--resume")
    refused(invoke("pull", "demo-sb-tiny", "-o", grown / "inner"), "inside the learner")
    refused(invoke("pull", "demo-sb-tiny", "-o", a_file), "is a file")
    refused(invoke("pull", "demo-sb-tiny", "-o", grown), "already holds a learner")
    assert a_file.read_text() == "mine" and not (grown / "inner").exists()


def test_a_pulled_learner_follows_the_umask_and_grows_into_format_2(tmp_path, color_data):
    old = os.umask(0o022)
    try:
        res = invoke("pull", "demo-sb-tiny", "-o", tmp_path / "p")
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "p").stat().st_mode & 0o777 == 0o755
    assert tree(tmp_path / "p") == tree(ZOO_V1)
    res = invoke("add-task", tmp_path / "p", color_data["task2_train"], "--device", "cpu", "--epochs", "1", "--keep", "1")
    assert res.exit_code == 0, res.output
    stored = json.loads((tmp_path / "p" / "learner.json").read_text())
    assert stored["format_version"] == 4 and list(stored["kept_steps"]) == ["3"] and stored["keep"] == 1
    assert not (tmp_path / "p" / "model.safetensors").exists()


def test_two_concurrent_add_tasks_one_is_refused_and_no_step_is_lost(grown, tmp_path, color_data):
    learner = tmp_path / "l"
    shutil.copytree(grown, learner)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    cmds = []
    for t in (1, 2):  # two new class sets (the colours renamed, so that neither collides with the learner's)
        renamed = tmp_path / f"new{t}"
        for cls in color_data[f"task{t}_train"].iterdir():
            shutil.copytree(cls, renamed / f"{cls.name}-{t}")
        cmds.append([sys.executable, "-m", "sbcli", "add-task", str(learner), str(renamed), "--device", "cpu", "--epochs", "1"])
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for cmd in cmds]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    steps = len(json.loads((learner / "learner.json").read_text())["history"])
    if codes == [0, 0]:  # one finished before the other started: both steps are there
        assert steps == 4
        return
    assert codes == [0, 1], outs
    assert any("being written by sb add-task" in " ".join(err.split()) for _, err in outs), outs
    assert steps == 3


def test_train_reads_a_learner_an_old_save_left_beside_out_where_it_lies_before_the_lock(color_data, tmp_path,
                                                                                       monkeypatch):
    """What an interrupted 0.1 save left beside --out is put back by the writer's lock alone: the checks before
    it read that learner where it lies, refuse a new run over it, and move nothing."""
    from sbcli.learner.store import legacy

    calls, real = [], legacy.recover
    monkeypatch.setattr(legacy, "recover", lambda *a, **k: calls.append(k) or real(*a, **k))
    shutil.copytree(ZOO_V1, tmp_path / ".l.old-4242")
    shutil.copytree(ZOO_V1, tmp_path / ".l.tmp-abcd1234")
    before = tree(tmp_path)
    refused(invoke("train", color_data["task1_train"], "--out", tmp_path / "l", *SMALL),
            "interrupted save left one beside it", "--resume")
    assert tree(tmp_path) == before and not (tmp_path / "l").exists()
    refused(invoke("train", color_data["task1_train"], "--out", tmp_path / "l", "--resume", *SMALL),
            "another source")  # its sequence, read where it lay, is the demo's: refused under the lock
    assert (tmp_path / "l" / "learner.json").is_file()  # which put it back, once
    assert calls == [{"writer": True}]  # the lock's alone: nothing before it, nor the load under it, looks again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l"]
