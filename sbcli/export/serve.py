"""Serving: top-k labels with probabilities from a learner (PyTorch) or an exported ONNX file.

Both kinds take the same input, so ``sb predict`` shows what a served model will answer: image
files are decoded to RGB at the model's resolution, scaled to [0, 1] and fed NCHW; the learner
runs :func:`sbcli.export.onnx.serving_model` (the graph the ONNX file was exported from) and the
ONNX file runs in onnxruntime. Probabilities are the softmax of the scores (for nearest-mean
learners the scores are negative squared distances, so these are relative, not calibrated).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from sbcli.errors import ConfigError, DataError


@dataclass(frozen=True)
class Prediction:
    """The top labels of one image, best first."""

    image: str
    labels: list[str]
    probabilities: list[float]

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image,
                "top": [{"label": n, "probability": p} for n, p in zip(self.labels, self.probabilities, strict=True)]}


class Classifier(Protocol):
    """Anything that scores [B, 3, S, S] float32 images in [0, 1] over ``class_names``."""

    kind: str
    class_names: list[str]
    image_size: int

    def scores(self, images: np.ndarray) -> np.ndarray: ...


@dataclass
class TorchClassifier:
    """A learner directory, run in PyTorch."""

    model: Any  # ServingModel
    class_names: list[str]
    image_size: int
    device: Any  # torch.device
    kind: str = "learner"

    def scores(self, images: np.ndarray) -> np.ndarray:
        import torch

        from sbcli.device import exact_float32

        with torch.no_grad(), exact_float32(self.device):
            return self.model(torch.from_numpy(images).to(self.device)).float().cpu().numpy()


@dataclass
class OnnxClassifier:
    """An ``sb export`` ONNX file, run in onnxruntime."""

    session: Any
    class_names: list[str]
    image_size: int
    input_name: str
    output_name: str
    kind: str = "onnx"

    def scores(self, images: np.ndarray) -> np.ndarray:
        return self.session.run([self.output_name], {self.input_name: images})[0]


def _is_learner(path: Path) -> bool:
    return path.is_dir() and (path / "learner.json").is_file()


def _is_onnx(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".onnx"


def open_learner(path: Path, device: str) -> TorchClassifier:
    from sbcli.device import resolve_device
    from sbcli.export.onnx import serving_model
    from sbcli.learner import Learner

    dev = resolve_device(device)
    learner = Learner.load(path, "cpu")
    model = serving_model(learner).to(dev)
    return TorchClassifier(model, list(learner.state.class_names), learner.state.image_size, dev)


def open_onnx(path: Path, device: str) -> OnnxClassifier:
    from sbcli.device import resolve_device
    from sbcli.export.onnx import read_metadata, require_onnxruntime

    ort = require_onnxruntime()
    wanted = ["CUDAExecutionProvider"] if resolve_device(device).type == "cuda" else []
    providers = [p for p in wanted if p in ort.get_available_providers()] + ["CPUExecutionProvider"]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(path), options, providers=providers)
    except Exception as err:  # onnxruntime raises its own untyped errors for unreadable models
        raise DataError(f"onnxruntime cannot load {path} ({type(err).__name__}: {err}); export it again.") from err
    meta = read_metadata(session, path)
    return OnnxClassifier(session, meta.class_names, meta.image_size, meta.input_name, meta.output_name)


OPENERS: dict[str, tuple[Callable[[Path], bool], Callable[[Path, str], Classifier]]] = {
    "learner": (_is_learner, open_learner),
    "onnx": (_is_onnx, open_onnx),
}


def open_classifier(path: Path, device: str = "auto") -> Classifier:
    """A learner directory or an ``.onnx`` file, ready to score images.

    Raises:
        ConfigError: ``path`` is neither.
    """
    path = Path(path)
    for matches, opener in OPENERS.values():
        if matches(path):
            return opener(path, device)
    raise ConfigError(f"{path} is neither a learner directory (with learner.json) nor an .onnx file; give one of those.")


def find_images(paths: Sequence[Path]) -> list[Path]:
    """Image files named directly, plus every image below the folders named (sorted).

    Raises:
        DataError: a path does not exist, or no image was found.
    """
    from sbcli.data.sources import IMAGE_EXTENSIONS

    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
                            and not p.name.startswith("."))
        else:
            raise DataError(f"{path} does not exist; give image files or folders of images.")
    if not found:
        raise DataError(f"No image files in {', '.join(map(str, paths))}; give .jpg, .png, ... files or folders holding them.")
    return found


def decode(paths: Sequence[Path], image_size: int) -> np.ndarray:
    """float32 [N, 3, S, S] in [0, 1]; raises DataError naming a file that cannot be decoded."""
    from sbcli.data.sources import decode_many

    raw = decode_many([str(p) for p in paths], lambda key: Path(key).read_bytes(), str, image_size)
    return raw.astype(np.float32) / 255.0


def softmax(scores: np.ndarray) -> np.ndarray:
    shifted = scores - scores.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def _batches(items: Sequence[Path], size: int) -> Iterator[Sequence[Path]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def predict(model: Path, images: Sequence[Path], *, top_k: int = 5, batch_size: int = 64,
            device: str = "auto") -> list[Prediction]:
    """Top-``top_k`` labels and probabilities of every image, in the order found.

    Raises:
        ConfigError: ``model`` is not a learner or ONNX file, or ``top_k``/``batch_size`` < 1.
        DataError: a missing path, no images, or an image that cannot be decoded.
        ExportError: an ONNX file without sbcli metadata, or onnxruntime is not installed.
    """
    if top_k < 1 or batch_size < 1:
        raise ConfigError("--top-k and --batch-size must be at least 1.")
    files = find_images(images)
    classifier = open_classifier(model, device)
    k = min(top_k, len(classifier.class_names))
    out: list[Prediction] = []
    for batch in _batches(files, batch_size):
        probs = softmax(classifier.scores(decode(batch, classifier.image_size)).astype(np.float64))
        for path, row in zip(batch, probs, strict=True):
            best = np.argsort(-row, kind="stable")[:k]
            out.append(Prediction(str(path), [classifier.class_names[i] for i in best], [float(row[i]) for i in best]))
    return out
