"""ONNX export: parity with PyTorch for every method's inference, metadata, dynamic batch, refusals."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from learners import NORM, SIZE, make_learner
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.data.sources import load_folder
from sbcli.engine.loop import Engine, TrainConfig
from sbcli.errors import ConfigError, ExportError
from sbcli.export import onnx as onnx_export
from sbcli.learner.state import Learner
from sbcli.methods import METHODS, build_config, inference, list_methods
from sbcli.methods.rules import RULES


def run_onnx(path: Path, images: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"images": images})[0]


def torch_scores(learner: Learner, images: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return onnx_export.serving_model(learner)(torch.from_numpy(images)).numpy()


def images01(n: int, seed: int, size: int = SIZE) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 3, size, size), dtype=np.float32)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Learner, Path, onnx_export.OnnxReport]:
    learner = make_learner("std")
    out = tmp_path_factory.mktemp("onnx") / "model.onnx"
    return learner, out, onnx_export.export_onnx(learner, out)


def default_rule(method: str) -> str:
    return build_config(method, {}).inference


# Every registered inference rule (those in the weights and those with a scoring module of their own).
KNOWN_RULES = sorted(RULES.names())


def accepted_rules(method: str) -> list[str]:
    """The known inference rules that ``method``'s Config accepts."""
    rules = []
    for rule in KNOWN_RULES:
        try:
            build_config(method, {"inference": rule})
        except ConfigError:
            continue
        rules.append(rule)
    return rules


# Every method with its default rule, plus every other rule STD offers (BiC and iCaRL keep state of their own).
DEFAULTS = {(m, default_rule(m)) for m in list_methods()}
COMBOS = sorted(DEFAULTS | {("std", r) for r in accepted_rules("std") if r not in {rule for _, rule in DEFAULTS}})


@pytest.fixture(scope="module")
def four_classes(color_data, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The four colour classes in one class-per-folder tree (symlinks), to train as two tasks of two."""
    root = tmp_path_factory.mktemp("four")
    for split in ("train", "test"):
        for task in ("task1", "task2"):
            for cls in color_data[f"{task}_{split}"].iterdir():
                (root / split).mkdir(exist_ok=True)
                (root / split / cls.name).symlink_to(cls, target_is_directory=True)
    return {"train": root / "train", "test": root / "test"}


@pytest.fixture(scope="module")
def trained(four_classes, tmp_path_factory: pytest.TempPathFactory):
    """train(method, rule) -> a learner directory after two tasks (1 epoch, width 0.125, 16 px), made once."""
    made: dict[tuple[str, str], Path] = {}

    def train(method: str, rule: str) -> Path:
        if (method, rule) not in made:
            out = tmp_path_factory.mktemp(f"{method}-{rule}") / "learner"
            frozen = METHODS.get(method).frozen_backbone  # random weights on purpose: the rule is what is tested
            run = api.RunOptions(method=method, method_options={"inference": rule}, width=0.125,
                                 train=TrainConfig(epochs=1, batch_size=16), memory=12, device="cpu",
                                 pretrained="random" if frozen else None)
            seq = api.SequenceOptions(source=str(four_classes["train"]), test=str(four_classes["test"]), image_size=SIZE, tasks=2)
            api.train(seq, run, out)
            made[method, rule] = out
        return made[method, rule]

    return train


@pytest.mark.parametrize(("method", "rule"), COMBOS)
def test_every_methods_inference_matches_pytorch(method: str, rule: str, trained, four_classes, tmp_path: Path) -> None:
    """Export a trained learner; ONNX equals PyTorch on its exemplars and predicts as `sb evaluate` scores."""
    learner_dir = trained(method, rule)
    report = api.export_onnx(learner_dir, tmp_path / "model.onnx")
    assert report.inference == rule
    assert report.parity.source == "images from the exemplar memory" and report.parity.images == 12
    assert report.parity.max_abs_diff <= 1e-4 * max(1.0, report.parity.score_scale)
    assert report.parity.argmax_agreement == 1.0
    learner = Learner.load(learner_dir)
    test = load_folder(four_classes["test"], SIZE, cache=None).data
    engine = Engine(TrainConfig(), torch.device("cpu"), learner.norm, 0)
    evaluated = inference.scores(learner.model, learner.extra, rule, engine, test.images).numpy()
    got = run_onnx(report.path, test.images.numpy().astype(np.float32) / 255.0)
    # a 1-epoch model can have huge logits: the tolerance is relative to their scale
    np.testing.assert_allclose(got, evaluated, atol=1e-4 * max(1.0, float(np.abs(evaluated).max())), rtol=0)
    assert (got.argmax(1) == evaluated.argmax(1)).mean() >= 1 - 1 / len(test)  # a near-tie may flip one
    if rule == "icarl":
        check_class_means_in_graph(learner, report.path)


def check_class_means_in_graph(learner: Learner, path: Path) -> None:
    """The exported nearest-mean scores are -||f/|f| - mu_c||^2 with the learner's stored class means."""
    means = [v for k, v in learner.extra.items() if k.startswith("nme.")]
    assert len(means) == 1 and means[0].shape == (learner.model.num_classes, learner.model.num_features)
    x = images01(6, seed=11)
    with torch.no_grad():
        mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (learner.norm.mean, learner.norm.std))
        f = torch.nn.functional.normalize(learner.model.eval().forward_features((torch.from_numpy(x) - mean) / std), dim=1)
    expected = -(torch.cdist(f, means[0]) ** 2)  # iCaRL: the nearest class mean scores highest
    np.testing.assert_allclose(run_onnx(path, x), expected.numpy(), atol=1e-4, rtol=0)


def test_metadata_describes_the_model(exported) -> None:
    learner, path, report = exported
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    assert json.loads(meta["class_names"]) == learner.state.class_names
    assert json.loads(meta["class_tasks"]) == [0, 0, 0, 1, 1]
    assert json.loads(meta["input_size"]) == [3, SIZE, SIZE]
    assert meta["input_range"] == "[0, 1]"
    assert json.loads(meta["normalization"]) == {**NORM, "where": "inside_graph"}  # strict JSON
    spec = json.loads(meta["preprocess"])
    assert spec["resize"] == {"width": SIZE, "height": SIZE, "filter": "bilinear", "antialias": True,
                              "keep_aspect_ratio": False, "reference": "Pillow Image.resize"}
    assert spec["decode"]["jpeg_reduced_decode"] is True and spec["divide_by"] == 255.0  # as training decodes
    assert (spec["channel_order"], spec["layout"], spec["normalization"]["mean"]) == ("RGB", "NCHW", NORM["mean"])
    assert (meta["sbcli_format"], meta["precision"], meta["opset"]) == ("2", "float32", str(report.opset))
    assert json.loads(meta["provenance"]) == learner.state.provenance.to_json()
    assert (meta["method"], meta["inference"], meta["steps"]) == ("std", "wa", "2")
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, out.name) == ("images", "logits")
    assert isinstance(inp.shape[0], str) and inp.shape[1:] == [3, SIZE, SIZE]  # a named, dynamic batch axis
    assert out.shape[1] == 5
    assert report.bytes == path.stat().st_size and not list(path.parent.glob(".*tmp"))
    assert not path.with_name(path.name + ".data").exists()  # self-contained: no external data file


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_dynamic_batch_sizes_match_pytorch(exported, batch: int) -> None:
    learner, path, _ = exported
    x = images01(batch, seed=batch)
    got, ref = run_onnx(path, x), torch_scores(learner, x)
    assert got.shape == (batch, 5)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    assert (got.argmax(1) == ref.argmax(1)).all()


def test_normalisation_is_inside_the_graph(exported) -> None:
    """The ONNX model takes [0, 1] images: equal to the raw network on hand-normalised input."""
    learner, path, _ = exported
    x = images01(4, seed=7)
    mean, std = (np.array(NORM[k], dtype=np.float32).reshape(1, 3, 1, 1) for k in ("mean", "std"))
    with torch.no_grad():
        raw = learner.model.eval()(torch.from_numpy((x - mean) / std)).numpy()
    np.testing.assert_allclose(run_onnx(path, x), raw, atol=1e-4, rtol=0)


def test_failed_parity_check_leaves_nothing(exported, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx

    learner, path, _ = exported
    bad = onnx_export.Parity(10, "exemplar memory", (10, 1), max_abs_diff=0.5, score_scale=3.0, argmax_agreement=0.9)
    monkeypatch.setattr(onnx_export, "export_proto", lambda *args: onnx.load(str(path)))  # skip re-tracing
    monkeypatch.setattr(onnx_export, "compare", lambda *args: bad)
    (tmp_path / "model.onnx").write_bytes(b"previous export")
    with pytest.raises(ExportError, match="differ from PyTorch by 0.5"):
        onnx_export.export_onnx(learner, tmp_path / "model.onnx")
    assert (tmp_path / "model.onnx").read_bytes() == b"previous export"
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]


def test_missing_onnx_extra_names_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # makes `import onnxscript` fail
    with pytest.raises(ExportError, match=r'pip install "sbcli\[onnx\]"'):
        onnx_export.export_onnx(make_learner("std"), tmp_path / "m.onnx")


def test_cli_prints_the_parity_check(tmp_path: Path) -> None:
    """Also: a learner without exemplars is checked on random images, and says so."""
    make_learner("finetune", tasks=(2,), exemplars=0).save(tmp_path / "learner")
    res = CliRunner().invoke(app, ["export", str(tmp_path / "learner"), "--format", "onnx", "-o", str(tmp_path / "m.onnx")])
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "max |ONNX - PyTorch| =" in text and "argmax agreement 100.0 %" in text
    assert "64 random images, as the learner has no exemplars" in text and (tmp_path / "m.onnx").is_file()
    res = CliRunner().invoke(app, ["export", str(tmp_path / "learner"), "--format", "tflite"])
    assert res.exit_code == 2 and "tflite" in res.output


def test_cli_on_a_missing_learner_is_one_clear_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["export", str(tmp_path / "nope"), "-o", str(tmp_path / "m.onnx")])
    assert res.exit_code == 1 and "No learner at" in res.output and not (tmp_path / "m.onnx").exists()


def test_half_export_is_checked_and_keeps_float32_io(tmp_path: Path) -> None:
    """--half: fp16 weights inside, float32 in and out, parity within HALF_TOLERANCE and argmax agreement."""
    import onnx

    learner = make_learner("std", exemplars=40)
    report = onnx_export.export_onnx(learner, tmp_path / "half.onnx", onnx_export.OnnxConfig(half=True))
    assert report.precision == "float16"
    assert report.parity.max_abs_diff <= onnx_export.HALF_TOLERANCE * max(1.0, report.parity.score_scale)
    assert report.parity.argmax_agreement >= onnx_export.HALF_ARGMAX
    proto = onnx.load(str(report.path))
    fp16 = [t for t in proto.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    assert len(fp16) > 10  # the weights are stored in fp16
    assert report.bytes < 0.6 * onnx_export.export_onnx(learner, tmp_path / "full.onnx").bytes
    x = images01(16, seed=3)
    got, ref = run_onnx(report.path, x), torch_scores(learner, x)
    assert got.dtype == np.float32 and got.shape == (16, 5)
    np.testing.assert_allclose(got, ref, atol=onnx_export.HALF_TOLERANCE * max(1.0, float(np.abs(ref).max())), rtol=0)
    meta = ort.InferenceSession(str(report.path), providers=["CPUExecutionProvider"]).get_modelmeta().custom_metadata_map
    assert meta["precision"] == "float16"


def test_half_export_refuses_a_poor_argmax_agreement(exported, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    learner, path, _ = exported
    bad = onnx_export.Parity(50, "exemplar memory", (50, 1), max_abs_diff=1e-3, score_scale=3.0, argmax_agreement=0.9)
    monkeypatch.setattr(onnx_export, "export_proto", lambda *args: onnx_export_load(path))
    monkeypatch.setattr(onnx_export, "compare", lambda *args: bad)
    with pytest.raises(ExportError, match="top-1 agrees with PyTorch on only 90.0 %"):
        onnx_export.export_onnx(learner, tmp_path / "m.onnx", onnx_export.OnnxConfig(half=True))
    assert list(tmp_path.iterdir()) == []


def onnx_export_load(path: Path):
    import onnx

    return onnx.load(str(path))


def test_opset_is_chosen_within_the_supported_range(tmp_path: Path) -> None:
    import onnx

    make_learner("std").save(tmp_path / "learner")
    report = api.export_onnx(tmp_path / "learner", tmp_path / "m21.onnx", opset=21)
    assert report.opset == 21
    assert {o.version for o in onnx.load(str(report.path)).opset_import if o.domain in ("", "ai.onnx")} == {21}
    for bad in (onnx_export.MIN_OPSET - 1, onnx_export.MAX_OPSET + 1):
        res = CliRunner().invoke(app, ["export", str(tmp_path / "learner"), "--opset", str(bad), "-o", str(tmp_path / "x.onnx")])
        assert res.exit_code == 1 and f"--opset {bad} is outside the supported range 18 to 25" in " ".join(res.output.split())
        assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize(("umask", "file_mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_written_files_follow_the_umask(exported, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask: int,
                                        file_mode: int) -> None:
    learner, path, _ = exported
    monkeypatch.setattr(onnx_export, "export_proto", lambda *args: onnx_export_load(path))  # skip re-tracing
    old = os.umask(umask)
    try:
        report = onnx_export.export_onnx(learner, tmp_path / "sub" / "model.onnx")
    finally:
        os.umask(old)
    assert stat.S_IMODE(report.path.stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "sub").stat().st_mode) == 0o777 & ~umask


def test_a_traced_export_falls_back_to_torch_export_where_tracing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sb serve LEARNER` asks for the TorchScript exporter (seconds sooner); where it fails, torch.export's graph."""
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3 * 4 * 4, 2)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return self.linear(images.flatten(1))

    model, real = Tiny().eval(), torch.onnx.export

    def no_tracing(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if kwargs.get("dynamo") is False:
            raise RuntimeError("no TorchScript exporter here")
        return real(*args, **kwargs)

    traced = onnx_export.export_proto(model, 4, onnx_export.OnnxConfig(traced=True))
    assert [i.name for i in traced.graph.input] == [onnx_export.INPUT_NAME]
    monkeypatch.setattr(torch.onnx, "export", no_tracing)
    fallback = onnx_export.export_proto(model, 4, onnx_export.OnnxConfig(traced=True))
    assert [i.name for i in fallback.graph.input] == [onnx_export.INPUT_NAME]
    assert [o.name for o in fallback.graph.output] == [onnx_export.OUTPUT_NAME]
