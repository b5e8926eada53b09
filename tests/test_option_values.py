"""Every numeric option of every command, drawn at its worst (NaN, infinities, huge and negative
numbers, wrong types): one sentence and a non-zero exit, or a run whose learner every command loads.

The numeric options are found from the commands' signatures, so an option added later is drawn too.
Where a value is accepted, the work is cut short at the first moment the learner exists in memory
(its plan announced) and its state is checked by the loader's own rules; commands that need no
learner run as they are.
"""

from __future__ import annotations

import inspect
import json
import shutil
import typing
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_store_cli import SMALL
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.learner import validate

runner = CliRunner()
HOSTILE = ["nan", "NaN", "inf", "-inf", "1e400", "-1e400", "-1", "0", "-0.0", "1180591620717411303424",
           "-99999999999999999999", "1e-320", "abc", "", "1,5", "0x10", "1.5", "2"]


def numeric_options(command: str) -> list[tuple[str, type]]:
    """(flag, int or float) of every numeric option of ``command``, read from its signature."""
    callback = next(c.callback for c in app.registered_commands if c.name == command)
    found = []
    for p in inspect.signature(callback, eval_str=True).parameters.values():
        if typing.get_origin(p.annotation) is not typing.Annotated:
            continue
        base, *meta = typing.get_args(p.annotation)
        kinds = [a for a in typing.get_args(base) if a is not type(None)] or [base]
        info = next((m for m in meta if isinstance(m, typer.models.OptionInfo)), None)
        if info is None or kinds[0] not in (int, float):
            continue
        decls = [d for d in (info.param_decls or ()) if d.startswith("--")]
        found.append((decls[0] if decls else "--" + p.name.replace("_", "-"), kinds[0]))
    return found


def values(kind: type) -> st.SearchStrategy[str]:
    numbers = st.integers(-(2**80), 2**80).map(str)
    if kind is float:
        numbers = st.one_of(numbers, st.floats(allow_nan=True, allow_infinity=True).map(repr))
    return st.one_of(st.sampled_from(HOSTILE), numbers)


def one_sentence_or_accepted(res, accepted: list) -> None:
    """Refused in one sentence (or Typer's usage error for a value of the wrong type), or accepted."""
    out = res.output
    if accepted:  # the run was stopped at its plan (the stop itself is what the error boundary then says)
        return
    assert "Traceback" not in out and "Unexpected error" not in out and "bug in sbcli" not in out, out
    if res.exit_code == 2:  # Typer's usage error: "Invalid value for '--epochs': 'nan' is not a valid integer."
        assert out.startswith("Usage: sb ") and "Error" in out, out
        return
    assert res.exit_code == 1, out
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and res.stderr.rstrip().endswith(errors[0].rstrip()), res.stderr


class Accepted(Exception):
    """The options passed every check: the run reached its plan."""


def files(learner: Path) -> list[str]:
    return sorted(p.name for p in learner.rglob("*") if not p.name.startswith(".sbcli.lock"))


def learner_loads(state) -> None:
    """The state a run would save, with one class learned, passes every check a load applies."""
    data = json.loads(json.dumps(state.to_json(), allow_nan=True))  # as saved: tuples become lists
    data.update(class_names=["a"], class_task=[0], tasks=[{"classes": ["a"], "source": {"kind": "demo", "name": "demo"}}],
                history=[{"step": 1, "num_classes": 1, "metrics": {"overall": 50.0, "per_task": [50.0]}}])
    validate.check_state_json(data, "learner.json")


def stop_at_plan(monkeypatch, module: str, accepted: list) -> None:
    def plan(on_progress, state, sizes):
        accepted.append(state)
        raise Accepted

    monkeypatch.setattr(f"sbcli.run.{module}.announce_plan", plan)


EXAMPLES = settings(max_examples=8, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TRAIN_SMALL = [a for a in SMALL if a not in ("--width", "0.125")]  # --width is drawn too


@pytest.mark.parametrize(("flag", "kind"), numeric_options("train"))
def test_every_numeric_option_of_train(flag, kind, color_data, tmp_path, monkeypatch):
    base = {"--epochs": "1", "--batch-size": "16", "--memory": "8", "--image-size": "16", "--width": "0.125"}
    fixed = [x for k, v in base.items() if k != flag for x in (k, v)]

    @EXAMPLES
    @given(value=values(kind))
    def check(value):
        accepted: list = []
        stop_at_plan(monkeypatch, "sequence", accepted)
        out = tmp_path / "out"
        shutil.rmtree(out, ignore_errors=True)
        res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--pretrained", "none", "--out", str(out), "--device", "cpu",
                                  "--quiet", *fixed, flag, value])
        one_sentence_or_accepted(res, accepted)
        if accepted:
            learner_loads(accepted[0])
        else:
            assert not out.exists()  # refused before any work: nothing written

    check()


@pytest.mark.parametrize(("flag", "kind"), numeric_options("add-task"))
def test_every_numeric_option_of_add_task(flag, kind, one_task_learner, color_data, tmp_path, monkeypatch):
    learner = tmp_path / "L"
    shutil.copytree(one_task_learner, learner)
    before = files(learner)

    @EXAMPLES
    @given(value=values(kind))
    def check(value):
        accepted: list = []
        stop_at_plan(monkeypatch, "add_task", accepted)
        res = runner.invoke(app, ["add-task", str(learner), str(color_data["task2_train"]), "--device", "cpu",
                                  "--quiet", flag, value])
        one_sentence_or_accepted(res, accepted)
        if accepted:
            learner_loads(accepted[0])
        assert files(learner) == before  # refused or stopped before the save: the learner as it was

    check()


@pytest.mark.parametrize(("flag", "kind"), numeric_options("bench"))
def test_every_numeric_option_of_bench(flag, kind, tmp_path, monkeypatch):
    @EXAMPLES
    @given(value=values(kind))
    def check(value):
        accepted: list = []
        stop_at_plan(monkeypatch, "sequence", accepted)
        res = runner.invoke(app, ["bench", "--out", str(tmp_path / "bench"), "--methods", "finetune", "--tasks", "2",
                                  "--device", "cpu", "--quiet", "--no-plots", flag, value])
        one_sentence_or_accepted(res, accepted)
        if accepted:
            learner_loads(accepted[0])

    check()


@pytest.fixture(scope="module")
def onnx_model(one_task_learner, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("values") / "model.onnx"
    assert runner.invoke(app, ["export", str(one_task_learner), "-o", str(out), "--quiet"]).exit_code == 0
    return out


def commands_on_a_learner(learner: Path, onnx: Path, images: Path, tmp: Path) -> dict[str, list[str]]:
    """The arguments each remaining command is run with (its drawn option appended)."""
    return {"evaluate": ["evaluate", str(learner), "--device", "cpu"],
            "export": ["export", str(learner), "-o", str(tmp / "m.onnx"), "--overwrite", "--quiet"],
            "predict": ["predict", str(onnx), str(images)],
            "pull": ["pull", "demo-sb-tiny", "-o", str(tmp / "pulled"), "--quiet"],
            "rollback": ["rollback", str(learner)]}


@pytest.mark.parametrize(("command", "flag", "kind"), [(c, f, k) for c in ("evaluate", "export", "predict", "pull")
                                                      for f, k in numeric_options(c)])
def test_every_numeric_option_of_the_other_commands(command, flag, kind, one_task_learner, onnx_model, color_data,
                                                    tmp_path):
    learner = tmp_path / "L"
    shutil.copytree(one_task_learner, learner)
    args = commands_on_a_learner(learner, onnx_model, color_data["task1_test"], tmp_path)[command]

    @settings(max_examples=6, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(value=values(kind))
    def check(value):
        shutil.rmtree(tmp_path / "pulled", ignore_errors=True)
        res = runner.invoke(app, [*args, flag, value])
        one_sentence_or_accepted(res, [True] if res.exit_code == 0 else [])

    check()


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=values(int))
def test_rollbacks_step_argument(value, one_task_learner, tmp_path_factory):
    learner = tmp_path_factory.mktemp("rb") / "L"
    shutil.copytree(one_task_learner, learner)
    res = runner.invoke(app, ["rollback", str(learner), value])
    one_sentence_or_accepted(res, [True] if res.exit_code == 0 else [])


@pytest.mark.parametrize("option", [["--lr", "nan"], ["--lr", "inf"], ["--momentum", "nan"], ["--momentum", "2"],
                                    ["--method", "sb", "--rho", "nan"], ["--batch-size", "1000000000000"],
                                    ["--seed", "1180591620717411303424"], ["--warmup-epochs", "nan"],
                                    ["--threads", "5000"], ["--threads", "100000"], ["--order-seed", "-5"]])
def test_the_probes_train_options_are_one_sentence_before_any_work(option, color_data, tmp_path):
    out = tmp_path / "out"
    res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--pretrained", "none", "--out", str(out), "--device", "cpu", *option])
    one_sentence_or_accepted(res, [])
    assert option[-2] in res.stderr and not out.exists()


def test_threads_are_bounded_by_the_machines_cores(color_data, tmp_path, monkeypatch):
    from sbcli.engine import hardware

    monkeypatch.setattr(hardware, "cpu_cores", lambda: 4)
    res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--pretrained", "none", "--out", str(tmp_path / "o"), "--threads", "5"])
    one_sentence_or_accepted(res, [])
    assert "outside 1..4, the CPU cores this machine has" in " ".join(res.stderr.split())


def test_a_pull_timeout_that_is_no_duration_is_one_sentence(tmp_path):
    for value in ("-1", "0", "nan", "inf"):
        res = runner.invoke(app, ["pull", "tester/x", "-o", str(tmp_path / "x"), "--timeout", value])
        one_sentence_or_accepted(res, [])
        assert "--timeout" in res.stderr


def test_a_task_source_without_kind_is_damage_not_a_bug(one_task_learner, tmp_path):
    from learner_files import rehash

    learner = tmp_path / "L"
    shutil.copytree(one_task_learner, learner)
    state = json.loads((learner / "learner.json").read_text())
    del state["tasks"][0]["source"]["kind"]
    (learner / "learner.json").write_text(json.dumps(state))
    rehash(learner)
    for args in (["evaluate", str(learner), "--device", "cpu"], ["export", str(learner), "-o", str(tmp_path / "m.onnx")]):
        res = runner.invoke(app, args)
        one_sentence_or_accepted(res, [])
        assert "tasks[0].source.kind is missing" in res.stderr
