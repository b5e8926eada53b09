"""`sb export --int8`: a QDQ int8 model with per-channel weights, calibrated on the learner's own images,
checked against the float model on the carried test sample, refused (nothing written) below the threshold."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from learners import make_learner
from test_json_schemas import check
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.errors import ExportError
from sbcli.export import quantize
from sbcli.export.serving import open_learner
from sbcli.serve.predict import predict

runner = CliRunner()


def snapshot(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def int8_export(one_task_learner: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    before = snapshot(one_task_learner)
    out = tmp_path_factory.mktemp("int8") / "model-int8.onnx"
    res = runner.invoke(app, ["export", str(one_task_learner), "--int8", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert snapshot(one_task_learner) == before
    return out, json.loads(res.stdout)


def test_int8_is_qdq_per_channel_and_smaller(int8_export) -> None:
    out, report = int8_export
    check("export", json.dumps(report))
    r = report["int8"]
    assert r["bytes"] == out.stat().st_size < r["float_bytes"] / 2
    proto = onnx.load(str(out))
    ops = {n.op_type for n in proto.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    inits = {i.name: i for i in proto.graph.initializer}
    weight_dq = [n for n in proto.graph.node if n.op_type == "DequantizeLinear" and inits.get(n.input[0]) is not None
                 and inits[n.input[0]].data_type == onnx.TensorProto.INT8]
    assert weight_dq and all(len(inits[n.input[1]].dims) == 1 and inits[n.input[1]].dims[0] > 1 for n in weight_dq
                             if len(inits[n.input[0]].dims) == 4)  # conv weights: one scale per output channel
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["precision"] == "int8" and json.loads(meta["quantization"])["format"] == "QDQ"
    assert "class_names" in meta and "preprocess" in meta  # sb serve and sb predict read it unchanged


def test_int8_agrees_with_float_on_the_test_sample(int8_export, one_task_learner: Path, color_data) -> None:
    out, report = int8_export
    r = report["int8"]
    assert r["evaluation"]["source"] == "the carried test sample" and r["evaluation"]["images"] > 0
    assert r["calibration"]["source"] == "the exemplar memory"
    assert r["agreement"] >= r["min_agreement"] == 0.98
    assert r["float_accuracy"] > 0.75 and abs(r["int8_accuracy"] - r["float_accuracy"]) <= 1 - r["agreement"] + 1e-9
    files = sorted(Path(color_data["task1_test"]).rglob("*.png"))
    want = [p.labels[0] for p in predict(one_task_learner, files, top_k=1, open_learner=open_learner).predictions]
    got = [p.labels[0] for p in predict(out, files, top_k=1).predictions]
    assert np.mean(np.array(want) == np.array(got)) >= 0.9


def test_cli_prints_agreement_and_accuracies(one_task_learner: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["export", str(one_task_learner), "--int8", "-o", str(tmp_path / "m.onnx")],
                        env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "top-1 agreement with the float model" in text and "Accuracy on the carried test sample: float32" in text
    assert f"Wrote {tmp_path / 'm.onnx'}" in text and "int8 QDQ, weights per channel" in text


def test_refused_below_the_threshold_with_nothing_written(one_task_learner: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    real = quantize._evaluate

    def worse(*args, **kwargs):
        return {**real(*args, **kwargs), "agreement": 0.5}

    monkeypatch.setattr(quantize, "_evaluate", worse)
    before = snapshot(one_task_learner)
    res = runner.invoke(app, ["export", str(one_task_learner), "--int8", "-o", str(tmp_path / "m.onnx"),
                              "--int8-min-agreement", "0.9"])
    assert res.exit_code == 1 and "agrees with the float model on only 50.0 %" in res.output
    assert "at least 90.0 % needed" in res.output and "nothing was written" in res.output
    assert list(tmp_path.iterdir()) == [] and snapshot(one_task_learner) == before


def test_bad_combinations_are_refused(one_task_learner: Path, tmp_path: Path) -> None:
    for extra, words in ([["--half"], "choose one"], [["--format", "triton"], "one ONNX file"],
                         [["--int8-min-agreement", "1.5"], "between 0 and 1"]):
        res = runner.invoke(app, ["export", str(one_task_learner), "--int8", "-o", str(tmp_path / "m.onnx"), *extra])
        assert res.exit_code != 0 and words in " ".join(res.output.split()), res.output
    assert list(tmp_path.iterdir()) == []


def test_no_images_to_calibrate_on_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="neither an exemplar memory nor a carried test sample"):
        quantize.export_int8(make_learner("std", exemplars=0), tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []
