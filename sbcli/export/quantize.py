"""``sb export --int8``: a statically quantised ONNX model for CPUs (onnxruntime.quantization).

The float export (checked against PyTorch as usual) is quantised in QDQ format: weights int8 per
output channel, activations uint8 per tensor, their ranges calibrated (min/max) on the learner's own
images: the exemplar memory, or the carried test sample when the memory is empty. The int8 model is
then compared with the float one on the carried test sample (top-1 agreement, and the accuracy of
both against the true labels); without a test sample the agreement is measured on the calibration
images and no accuracy is reported. Below ``min_agreement`` nothing is written.

The metadata is the float file's (``sb serve``/``sb predict`` read it unchanged) with ``precision``
``int8`` and a ``quantization`` entry (format, calibration, agreement).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sbcli.atomic import current_umask, staging
from sbcli.errors import ConfigError, ExportError
from sbcli.export.onnx import INPUT_NAME, OUTPUT_NAME, OnnxConfig, OnnxReport, export_onnx, ort_session
from sbcli.learner.state import Learner

DEFAULT_MIN_AGREEMENT = 0.98
CALIBRATION_IMAGES = 512
CALIBRATION_BATCH = 32


@dataclass(frozen=True)
class Int8Config:
    """``min_agreement``: the least top-1 agreement with the float model (a fraction) for the file to be written."""

    min_agreement: float = DEFAULT_MIN_AGREEMENT
    calibration_images: int = CALIBRATION_IMAGES

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_agreement <= 1.0:
            raise ConfigError("--int8-min-agreement must be between 0 and 1 (a fraction of the test images).")
        if self.calibration_images < 1:
            raise ConfigError("The calibration needs at least one image.")


@dataclass(frozen=True)
class Int8Report:
    """What ``export_int8`` wrote and how the int8 model compared with the float one."""

    path: Path
    bytes: int
    float_bytes: int
    calibration: str  # where the calibration images came from
    calibration_images: int
    evaluation: str  # "the carried test sample" or "the calibration images"
    evaluation_images: int
    agreement: float  # top-1 agreement with the float model, in [0, 1]
    min_agreement: float
    float_accuracy: float | None  # on the carried test sample, in [0, 1]; None without one
    int8_accuracy: float | None
    float_report: OnnxReport

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "bytes": self.bytes, "float_bytes": self.float_bytes, "precision": "int8",
                "format": "QDQ", "weights": "int8 per channel", "activations": "uint8 per tensor",
                "calibration": {"source": self.calibration, "images": self.calibration_images},
                "evaluation": {"source": self.evaluation, "images": self.evaluation_images},
                "agreement": self.agreement, "min_agreement": self.min_agreement,
                "float_accuracy": self.float_accuracy, "int8_accuracy": self.int8_accuracy,
                "num_classes": self.float_report.num_classes, "image_size": self.float_report.image_size,
                "float_parity": self.float_report.parity.to_json()}


def require_quantization() -> Any:
    try:
        from onnxruntime import quantization
    except ImportError as err:
        raise ExportError('--int8 needs onnxruntime\'s quantization tools; install the ONNX extra: pip install "sbcli[onnx]".') from err
    return quantization


def calibration_images(learner: Learner, limit: int) -> tuple[np.ndarray, str]:
    """float32 [N, 3, S, S] in [0, 1]: the exemplar memory, else the carried test sample (spread evenly)."""
    images, _ = learner.memory.tensors()
    size = learner.state.image_size
    source = "the exemplar memory"
    if not len(images) or images.shape[-1] != size:
        sample = learner.test_sample
        if sample is None or not len(sample):
            raise ExportError("--int8 calibrates on the learner's own images, and this learner has neither an exemplar "
                              "memory nor a carried test sample; export it without --int8.")
        images, source = sample.images, "the carried test sample"
    idx = np.unique(np.linspace(0, len(images) - 1, min(limit, len(images))).round().astype(int))
    return images.numpy()[idx].astype(np.float32) / 255.0, source


def _reader(images: np.ndarray, quantization: Any) -> Any:
    class Reader(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.batches: Iterator[np.ndarray] = iter(np.array_split(images, max(1, len(images) // CALIBRATION_BATCH)))

        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(self.batches, None)
            return None if batch is None else {INPUT_NAME: np.ascontiguousarray(batch)}

    return Reader()


def _scores(path: Path, images: np.ndarray) -> np.ndarray:
    session = ort_session(path)
    return np.concatenate([session.run([OUTPUT_NAME], {INPUT_NAME: images[i : i + 256]})[0]
                           for i in range(0, len(images), 256)])


def quantize(float_path: Path, out: Path, images: np.ndarray) -> None:
    """QDQ static quantisation of ``float_path`` into ``out``, calibrated (min/max) on ``images``."""
    q = require_quantization()
    with tempfile.TemporaryDirectory(prefix=".sbcli-int8.", dir=out.parent) as work:
        pre = Path(work) / "pre.onnx"
        q.quant_pre_process(str(float_path), str(pre), skip_symbolic_shape=False)
        q.quantize_static(str(pre), str(out), _reader(images, q), quant_format=q.QuantFormat.QDQ, per_channel=True,
                          activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8,
                          calibrate_method=q.CalibrationMethod.MinMax)


def _metadata(float_path: Path, out: Path, extra: dict[str, str]) -> None:
    import onnx

    source, proto = onnx.load(str(float_path), load_external_data=False), onnx.load(str(out))
    meta = {p.key: p.value for p in source.metadata_props} | extra
    del proto.metadata_props[:]
    for key, value in meta.items():
        proto.metadata_props.add(key=key, value=value)
    proto.model_version = source.model_version
    onnx.save_model(proto, str(out))


def _evaluate(learner: Learner, float_path: Path, int8_path: Path, calibration: np.ndarray) -> dict[str, Any]:
    sample = learner.test_sample
    if sample is not None and len(sample):
        images, labels, where = sample.images.numpy().astype(np.float32) / 255.0, sample.labels.numpy(), "the carried test sample"
    else:
        images, labels, where = calibration, None, "the calibration images"
    ref, got = _scores(float_path, images).argmax(1), _scores(int8_path, images).argmax(1)
    out: dict[str, Any] = {"evaluation": where, "evaluation_images": len(images), "agreement": float((ref == got).mean()),
                           "float_accuracy": None, "int8_accuracy": None}
    if labels is not None:
        out["float_accuracy"], out["int8_accuracy"] = float((ref == labels).mean()), float((got == labels).mean())
    return out


def export_int8(learner: Learner, out: Path, cfg: Int8Config | None = None, onnx_cfg: OnnxConfig | None = None) -> Int8Report:
    """Write ``learner`` to ``out`` as a statically quantised int8 ONNX model (see the module docstring).

    Raises:
        ExportError: no images to calibrate on, the float export fails its check, or the int8 model
            agrees with the float one on less than ``cfg.min_agreement`` (nothing is written).
    """
    learner.state.require_classes("export")
    cfg, onnx_cfg = cfg or Int8Config(), onnx_cfg or OnnxConfig()
    if onnx_cfg.half:
        raise ConfigError("--int8 and --half are two ways to shrink the model; choose one.")
    out = Path(out)
    calibration, source = calibration_images(learner, cfg.calibration_images)
    out.parent.mkdir(parents=True, exist_ok=True)
    with staging(out, "int8") as work:  # a SIGKILLed export's folder is removed by the next writer beside it
        work.mkdir()
        float_path, int8_path = work / "float.onnx", work / "int8.onnx"
        float_report = export_onnx(learner, float_path, onnx_cfg)
        quantize(float_path, int8_path, calibration)
        result = _evaluate(learner, float_path, int8_path, calibration)
        if not result["agreement"] >= cfg.min_agreement:
            raise ExportError(f"The int8 model's top-1 agrees with the float model on only {100 * result['agreement']:.1f} % of "
                              f"{result['evaluation']} (at least {100 * cfg.min_agreement:.1f} % needed); nothing was written: "
                              "export without --int8, or lower --int8-min-agreement.")
        record = {"format": "QDQ", "weights": "int8 per channel", "activations": "uint8 per tensor",
                  "calibration": {"source": source, "images": len(calibration)}, **result}
        _metadata(float_path, int8_path, {"precision": "int8", "quantization": json.dumps(record)})
        os.chmod(int8_path, 0o666 & ~current_umask())
        float_bytes = float_path.stat().st_size
        os.replace(int8_path, out)
    return Int8Report(out, out.stat().st_size, float_bytes, source, len(calibration), result["evaluation"],
                      result["evaluation_images"], result["agreement"], cfg.min_agreement, result["float_accuracy"],
                      result["int8_accuracy"], OnnxReport(**{**float_report.__dict__, "path": out}))
