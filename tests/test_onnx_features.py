"""A frozen backbone's feature pass on onnxruntime: taken where its export agrees with PyTorch's float32 (checked
on the first images), kept in the cache by the backbone's fingerprint and reused, and left for PyTorch, with a
notice, where the export disagrees; SBCLI_FEATURE_ENGINE chooses."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime", reason="the onnxruntime feature pass needs the onnx extra (pip install 'sbcli[onnx]')")
# ruff: noqa: E402  (the skip above must come before the modules that use onnxruntime)
from sbcli.data.device import Normalization
from sbcli.engine import onnx_features
from sbcli.engine.loop import Engine, TrainConfig
from sbcli.errors import ConfigError, TrainingError
from sbcli.nets import create_model

pytestmark = pytest.mark.usefixtures("one_thread")
NORM = Normalization()


@pytest.fixture
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("resnet18", 3, 0.125).eval()


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randint(0, 256, (20, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(autouse=True)
def auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(onnx_features.ENV, raising=False)


def engine() -> Engine:
    return Engine(TrainConfig(eval_batch_size=8, threads=1), torch.device("cpu"), NORM, 0)


class CountingExports:
    """``_export_bytes``, counting its calls; ``of`` exports another model in place of the one asked for."""

    def __init__(self, of: torch.nn.Module | None = None) -> None:
        self.calls, self.of, self.real = 0, of, onnx_features._export_bytes

    def __call__(self, model: torch.nn.Module, norm: Normalization, size: int) -> bytes:
        self.calls += 1
        return self.real(self.of if self.of is not None else model, norm, size)


def prepare(model: torch.nn.Module, images: torch.Tensor, cache: Path) -> onnx_features.FeaturePass | None:
    e = engine()
    return onnx_features.prepare(model, images, lambda x: e.features(model, x), device=torch.device("cpu"),
                                 sharded=False, norm=NORM, threads=1, batch=8,
                                 cache=cache)


def test_the_frozen_pass_runs_on_onnxruntime_and_agrees_with_float32(model, images):
    e = engine()
    got = e.frozen_features(model, images)
    (taken,) = e.frozen_passes.values()
    assert isinstance(taken, onnx_features.FeaturePass)  # onnxruntime, not PyTorch (None)
    reference = e.features(model, images)
    assert got.dtype == torch.float32 and got.shape == reference.shape
    assert float((got - reference).abs().max() / reference.abs().max()) <= onnx_features.TOLERANCE
    assert e.feature_runtime() == "onnxruntime"


def test_a_cache_hit_reuses_the_export(model, images, tmp_path, monkeypatch):
    exports = CountingExports()
    monkeypatch.setattr(onnx_features, "_export_bytes", exports)
    first = prepare(model, images, tmp_path)
    kept = tmp_path / f"{onnx_features.export_key(model, NORM, 16)}.onnx"
    assert first is not None and exports.calls == 1 and kept.is_file()
    stored = kept.read_bytes()
    again = prepare(model, images, tmp_path)
    assert again is not None and exports.calls == 1 and kept.read_bytes() == stored  # loaded, not exported
    assert torch.equal(first(images), again(images))
    other = create_model("resnet18", 3, 0.125).eval()  # other weights: another file
    assert prepare(other, images, tmp_path) is not None and exports.calls == 2 and len(list(tmp_path.iterdir())) == 2


def test_a_damaged_cached_export_is_exported_again(model, images, tmp_path, monkeypatch):
    exports = CountingExports()
    monkeypatch.setattr(onnx_features, "_export_bytes", exports)
    kept = tmp_path / f"{onnx_features.export_key(model, NORM, 16)}.onnx"
    kept.write_bytes(b"not an onnx model")
    assert prepare(model, images, tmp_path) is not None and exports.calls == 1
    assert kept.read_bytes() != b"not an onnx model"


def test_a_disagreeing_export_falls_back_to_pytorch_with_a_notice(model, images, tmp_path, monkeypatch, caplog):
    torch.manual_seed(1)
    monkeypatch.setattr(onnx_features, "_export_bytes", CountingExports(of=create_model("resnet18", 3, 0.125).eval()))
    with caplog.at_level(logging.WARNING, logger="sbcli"):
        assert prepare(model, images, tmp_path) is None
    notices = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(notices) == 1 and "runs on PyTorch" in notices[0] and "float32" in notices[0], notices
    assert list(tmp_path.iterdir()) == []  # a disagreeing export is not kept
    monkeypatch.setenv("SBCLI_CACHE", str(tmp_path))  # the engine's pass exports (nothing cached there)
    e = engine()
    with caplog.at_level(logging.WARNING, logger="sbcli"):
        got = e.frozen_features(model, images)
    assert list(e.frozen_passes.values()) == [None] and torch.equal(got, e.features(model, images))


def test_the_environment_chooses_the_runtime(model, images, tmp_path, monkeypatch):
    on_gpu = {"device": torch.device("cuda"), "sharded": False, "norm": NORM, "threads": 1, "batch": 8, "cache": tmp_path}
    assert onnx_features.prepare(model, images, lambda x: x, **on_gpu) is None  # a GPU keeps the PyTorch pass
    across_ranks = {**on_gpu, "device": torch.device("cpu"), "sharded": True}
    assert onnx_features.prepare(model, images, lambda x: x, **across_ranks) is None  # ranks shard and gather
    monkeypatch.setenv(onnx_features.ENV, "torch")
    assert prepare(model, images, tmp_path) is None and engine().feature_runtime() == "torch"
    monkeypatch.setenv(onnx_features.ENV, "onnxruntime")
    with pytest.raises(ConfigError, match="one CPU process"):
        onnx_features.prepare(model, images, lambda x: x, **on_gpu)
    monkeypatch.setenv(onnx_features.ENV, "tensorrt")
    with pytest.raises(ConfigError, match="auto, torch or onnxruntime"):
        prepare(model, images, tmp_path)
    monkeypatch.setenv(onnx_features.ENV, "onnxruntime")
    torch.manual_seed(1)
    monkeypatch.setattr(onnx_features, "_export_bytes", CountingExports(of=create_model("resnet18", 3, 0.125).eval()))
    with pytest.raises(TrainingError, match="from PyTorch's float32"):  # asked for: an error, not a quiet fallback
        prepare(model, images, tmp_path)


def test_without_onnxruntime_the_pass_stays_on_pytorch_and_says_so(model, images, tmp_path, monkeypatch, caplog):
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as where it is not installed: importing it fails
    with caplog.at_level(logging.INFO, logger="sbcli"):
        assert prepare(model, images, tmp_path) is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "not installed" in said[0] and "sbcli[onnx]" in said[0], said
    assert engine().feature_runtime() == "torch" and list(tmp_path.iterdir()) == []
    monkeypatch.setenv(onnx_features.ENV, "onnxruntime")
    with pytest.raises(ConfigError, match="needs onnxruntime"):
        prepare(model, images, tmp_path)
