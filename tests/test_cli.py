"""End-to-end CLI runs (train -> add-task -> evaluate) and every bad input."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import interrupted_sequence
from typer.testing import CliRunner

from sbcli.cli.app import app

runner = CliRunner()
SMALL = ["--pretrained", "none", "--width", "0.125", "--epochs", "1", "--batch-size", "16", "--memory", "8", "--device", "cpu", "--image-size", "16"]


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file of a learner (the writer lock's files aside)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".sbcli.lock")}


@pytest.fixture(scope="module")
def trained(color_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "learner"
    res = invoke("train", color_data["task1_train"], "--test", color_data["task1_test"], "--out", out, "--method", "std", *SMALL)
    assert res.exit_code == 0, res.output
    return out


def test_help_does_not_import_torch():
    """`sb --help` stays fast by construction: the CLI imports no torch at load (no wall-clock bound, which a
    loaded machine could miss)."""
    code = "import sys; from sbcli.cli.app import app; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    out = subprocess.run([sys.executable, "-m", "sbcli", "--help"], capture_output=True, text=True, check=True)
    assert "add-task" in out.stdout


def test_a_learner_path_is_shown_as_written_never_as_markup_or_terminal_codes(trained, tmp_path):
    learner = tmp_path / "l[/]x[bold red]y\x1b[2J"
    shutil.copytree(trained, learner)
    for args in (["evaluate", learner, "--device", "cpu"], ["rollback", learner, "1"]):
        res = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})
        assert res.exit_code == 0, res.output
        shown = res.stdout + res.stderr
        unwrapped = "".join(shown.split())  # a table title wraps where its table ends, wherever the folder is
        assert "l[/]x[boldred]y" in unwrapped and "\x1b" not in shown  # the literal text, no raw escape


def test_train_add_task_evaluate_end_to_end(trained, color_data, tmp_path):
    learner = tmp_path / "grown"
    shutil.copytree(trained, learner)
    res = invoke("add-task", learner, color_data["task2_train"], "--test", color_data["task2_test"], "--device", "cpu")
    assert res.exit_code == 0, res.output
    res = invoke("evaluate", learner, "--json", "--device", "cpu")
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert result["classes"] == 4 and result["steps"] == 2 and result["test_images"] == 32
    assert len(result["metrics"]["per_task"]) == 2
    assert result["history"][1]["metrics"]["overall"] == pytest.approx(result["metrics"]["overall"])
    assert result["summary"]["avg_incremental_2_to_T"] == pytest.approx(result["metrics"]["overall"])
    res = invoke("evaluate", learner, color_data["task2_test"], "--device", "cpu")
    assert res.exit_code == 0 and "intra-old" in res.stdout


def test_train_prints_a_table_and_progress_goes_to_stderr(trained):
    res = invoke("evaluate", trained, "--device", "cpu")
    assert res.exit_code == 0
    assert "Accuracy after each step" in res.stdout and "Summary" in res.stdout


def assert_error(res, *words: str) -> None:
    assert res.exit_code == 1, res.output
    text = " ".join(res.stderr.split())
    for word in words:
        assert word in text, text


def test_missing_and_empty_folders(tmp_path):
    assert_error(invoke("train", tmp_path / "nope", "--out", tmp_path / "o", *SMALL), "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_error(invoke("train", empty, "--out", tmp_path / "o", *SMALL), "empty")
    (empty / "cat").mkdir()
    assert_error(invoke("train", empty, "--out", tmp_path / "o", *SMALL), "cat")
    assert not (tmp_path / "o").exists()


def test_undecodable_image_is_named(color_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(color_data["task1_train"], data)
    (data / "red" / "broken.jpg").write_bytes(b"not a jpeg")
    assert_error(invoke("train", data, "--out", tmp_path / "o", *SMALL), "broken.jpg")


def test_add_task_with_known_classes_leaves_the_learner_unchanged(trained, color_data):
    before = snapshot(trained)
    assert_error(invoke("add-task", trained, color_data["task1_train"], "--device", "cpu"), "already knows")
    assert snapshot(trained) == before


def test_add_task_with_missing_folder_leaves_the_learner_unchanged(trained, tmp_path):
    before = snapshot(trained)
    assert_error(invoke("add-task", trained, tmp_path / "nothing", "--device", "cpu"), "nothing")
    assert snapshot(trained) == before


def test_bad_learner_directories(trained, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(trained, broken)
    (broken / json.loads((broken / "learner.json").read_text())["files"]["model"]).unlink()
    assert_error(invoke("evaluate", broken, "--device", "cpu"), "model.safetensors")
    newer = tmp_path / "newer"
    shutil.copytree(trained, newer)
    state = json.loads((newer / "learner.json").read_text())
    state["format_version"] = 7
    (newer / "learner.json").write_text(json.dumps(state))
    assert_error(invoke("add-task", newer, tmp_path, "--device", "cpu"), "newer", "upgrade")


def test_tasks_that_do_not_divide_and_missing_cuda(color_data, tmp_path):
    assert_error(invoke("train", color_data["task1_train"], "--tasks", "3", "--out", tmp_path / "o", *SMALL), "--tasks 3")
    args = [a for a in SMALL if a not in ("--device", "cpu")]
    import torch

    if not torch.cuda.is_available():
        assert_error(invoke("train", color_data["task1_train"], "--device", "cuda", "--out", tmp_path / "o", *args), "CUDA")


def test_existing_output_is_not_overwritten_and_resume_continues(color_data, tmp_path):
    data, out = interrupted_sequence(color_data, tmp_path)
    assert len(json.loads((out / "learner.json").read_text())["history"]) == 1
    assert_error(invoke("train", data, "--tasks", "2", "--out", out, *SMALL), "--resume")
    res = invoke("train", data, "--tasks", "2", "--out", out, "--method", "finetune", "--resume", *SMALL)
    assert res.exit_code == 0, res.output
    state = json.loads((out / "learner.json").read_text())
    assert [h["step"] for h in state["history"]] == [1, 2] and len(state["class_names"]) == 4
    assert_error(invoke("train", data, "--tasks", "4", "--out", out, "--resume", *SMALL), "same options")


def test_method_options_that_do_not_apply_are_refused(color_data, tmp_path):
    assert_error(invoke("train", color_data["task1_train"], "--method", "std", "--rho", "1.2", "--out", tmp_path / "o", *SMALL),
                 "--rho", "std")
    assert_error(invoke("train", color_data["task1_train"], "--method", "sbb", "--out", tmp_path / "o", *SMALL), "Did you mean 'sb'")


def test_add_task_refuses_another_method(trained, color_data):
    before = snapshot(trained)
    assert_error(invoke("add-task", trained, color_data["task2_train"], "--method", "sb", "--device", "cpu"),
                 "--method std", "not sb")
    assert snapshot(trained) == before


def test_classes_keeps_the_first_classes_of_the_order(color_data, tmp_path):
    data = tmp_path / "four"
    shutil.copytree(color_data["task1_train"], data)
    shutil.copytree(color_data["task2_train"], data, dirs_exist_ok=True)
    out = tmp_path / "two"
    res = invoke("train", data, "--classes", "2", "--tasks", "2", "--out", out, "--method", "finetune", *SMALL)
    assert res.exit_code == 0, res.output
    state = json.loads((out / "learner.json").read_text())
    assert len(state["class_names"]) == 2 and state["class_task"] == [0, 1]
    assert_error(invoke("train", data, "--classes", "9", "--out", tmp_path / "o", *SMALL), "--classes 9")
