"""Every `--json` output, as a real run prints it, matches its schema in docs/cli.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sbcli.cli.app import app

jsonschema = pytest.importorskip("jsonschema")
DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
runner = CliRunner()


def schemas() -> dict[str, dict]:
    """The fenced schemas of docs/cli.md by name; each command's schema gets the shared ``$defs``."""
    blocks = {name: json.loads(text) for name, text in
              re.findall(r"<!-- schema: (\S+) -->\n```json\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)}
    defs = blocks.pop("$defs")
    return {name: {"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": defs, **schema}
            for name, schema in blocks.items()}


SCHEMAS = schemas()


def check(name: str, output: str) -> dict | list:
    data = json.loads(output)
    jsonschema.Draft202012Validator.check_schema(SCHEMAS[name])
    jsonschema.validate(data, SCHEMAS[name], cls=jsonschema.Draft202012Validator)
    return data


def cli(*args) -> str:
    res = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return res.stdout


def test_every_json_command_has_a_schema():
    assert set(SCHEMAS) == {"train", "add-task", "evaluate", "export", "export-triton", "predict", "pull", "pull-list",
                            "bench", "rollback", "forget"}


def test_schemas_refuse_what_they_should():
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"learner": "x", "history": [], "summary": {"last": 101}}, SCHEMAS["train"])


def test_train_add_task_and_evaluate(grown_run):
    assert check("train", grown_run["train"].stdout)["learner"] == "runs/train"
    assert check("add-task", grown_run["add"].stdout)["step"] == 3
    result = check("evaluate", cli("evaluate", grown_run["learner"], "--json", "--device", "cpu"))
    assert [len(row) for row in result["accuracy_matrix"]] == [1, 2, 3]


def test_predict_and_pull(grown_run, color_data, tmp_path):
    image = color_data["task1_test"] / "red" / "000.png"
    assert len(check("predict", cli("predict", grown_run["learner"], image, "--json", "--device", "cpu"))["predictions"]) == 1
    check("pull-list", cli("pull", "--list", "--json"))
    check("pull", cli("pull", "demo-sb-tiny", "-o", tmp_path / "pulled", "--json"))


def test_rollback(grown_run, tmp_path):
    import shutil

    learner = tmp_path / "l"
    shutil.copytree(grown_run["learner"], learner)
    assert check("rollback", cli("rollback", learner, "2", "--json"))["kept_steps"] == [1, 2, 3]


def test_export_to_a_file_and_the_hub(grown_run, fake_hub, tmp_path):
    pytest.importorskip("onnxruntime")
    out = check("export", cli("export", grown_run["learner"], "-o", tmp_path / "m.onnx", "--to-hub", "tester/schema",
                              "--json", "--quiet"))
    assert set(out) == {"onnx", "hub"}
    triton = check("export-triton", cli("export", grown_run["learner"], "--format", "triton", "-o", tmp_path / "repo",
                                        "--json"))
    assert triton["onnx"]["parity"]["argmax_agreement"] == 1.0


def test_bench(color_data, tmp_path):
    out = check("bench", cli("bench", color_data["task1_train"], "--test", color_data["task1_test"], "--methods",
                             "finetune", "--tasks", 1, "--epochs", 1, "--width", 0.125, "--batch-size", 16, "--memory", 8,
                             "--image-size", 16, "--device", "cpu", "--precision", "fp32", "--no-plots", "--json",
                             "--quiet", "--out", tmp_path / "bench"))
    assert out["methods"][0]["cells"]["1"]["epochs_per_step"] == [1]


def test_forget(grown_run, tmp_path):
    import shutil

    learner = tmp_path / "l"
    shutil.copytree(grown_run["learner"], learner)
    result = check("forget", cli("forget", learner, "red", "--json", "--device", "cpu"))
    assert result["forgotten"] == ["red"] and result["classes"] == 3 and result["exact"] is False
