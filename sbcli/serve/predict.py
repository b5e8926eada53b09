"""``sb predict``: top-k labels with probabilities for image files, in batches.

Probabilities are the softmax of the scores (for nearest-mean learners the scores are negative
squared distances, so these are relative, not calibrated).
"""

from __future__ import annotations

import stat
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sbcli.data.pixels import read_image_file  # regular files only, the size checked first
from sbcli.data.walk import walk_stats  # iterative: a folder nested thousands deep is no RecursionError
from sbcli.errors import ConfigError, DataError
from sbcli.serve.classifier import Classifier, LearnerOpener, open_classifier
from sbcli.serve.preprocess import IMAGE_EXTENSIONS, Preprocess


@dataclass(frozen=True)
class Prediction:
    """The top labels of one image, best first."""

    image: str
    labels: list[str]
    probabilities: list[float]

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image,
                "top": [{"label": n, "probability": p} for n, p in zip(self.labels, self.probabilities, strict=True)]}


@dataclass(frozen=True)
class Failure:
    """An image file that could not be read or decoded, and why (one sentence)."""

    image: str
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "error": self.error}


@dataclass(frozen=True)
class PredictReport:
    """What ``predict`` answered, and which model and provider answered it."""

    model: str
    kind: str  # "onnx" or "learner"
    provider: str  # "cpu", "cuda", "tensorrt", or "pytorch-cpu" / "pytorch-cuda" for a learner
    predictions: list[Prediction]
    failed: list[Failure] = field(default_factory=list)  # files that could not be read or decoded

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "kind": self.kind, "provider": self.provider,
                "predictions": [p.to_json() for p in self.predictions], "failed": [f.to_json() for f in self.failed]}


def find_images(paths: Sequence[Path]) -> list[Path]:
    """Image files named directly, plus every image below the folders named (sorted), symlinks followed as the
    training walk follows them.

    Raises:
        DataError: a path does not exist, a symlink loops or dangles, or no image was found.
    """
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += sorted(p for p, st in walk_stats(path) if stat.S_ISREG(st.st_mode)
                            and p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith("."))
        else:
            raise DataError(f"{path} does not exist; give image files or folders of images.")
    if not found:
        raise DataError(f"No image files in {', '.join(map(str, paths))}; give .jpg, .png, ... files or folders holding them.")
    return found


def _read_decode(spec: Preprocess, path: Path) -> np.ndarray:
    return spec.decode(read_image_file(path), str(path))


def decode(paths: Sequence[Path], spec: Preprocess, pool: ThreadPoolExecutor | None = None) -> np.ndarray:
    """float32 [N, 3, H, W] in [0, 1]; raises DataError naming a file that cannot be decoded."""
    if pool is None:
        return spec.to_input([_read_decode(spec, p) for p in paths])
    return spec.to_input(list(pool.map(lambda p: _read_decode(spec, p), paths)))


def softmax(scores: np.ndarray) -> np.ndarray:
    shifted = scores - scores.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def top_k(scores: np.ndarray, names: Sequence[str], k: int, images: Sequence[str]) -> list[Prediction]:
    """Predictions of every row of ``scores``: the ``k`` best labels with softmax probabilities."""
    probs = softmax(scores.astype(np.float64))
    k = min(k, len(names))
    out = []
    for image, row in zip(images, probs, strict=True):
        best = np.argsort(-row, kind="stable")[:k]
        out.append(Prediction(image, [names[i] for i in best], [float(row[i]) for i in best]))
    return out


def _batches(items: Sequence[Path], size: int) -> Iterator[Sequence[Path]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _decode_each(paths: Sequence[Path], spec: Preprocess, pool: ThreadPoolExecutor) -> list[np.ndarray | Failure]:
    """Each file decoded, or the sentence that says why it could not be."""

    def one(path: Path) -> np.ndarray | Failure:
        try:
            return _read_decode(spec, path)
        except DataError as err:
            return Failure(str(path), str(err))

    return list(pool.map(one, paths))


def predict_with(classifier: Classifier, files: Sequence[Path], *, k: int = 5,
                 batch_size: int = 64) -> tuple[list[Prediction], list[Failure]]:
    """Top-``k`` of every readable file with an open classifier, ``batch_size`` images per run (decoded on
    threads), and the files that could not be read or decoded."""
    out: list[Prediction] = []
    failed: list[Failure] = []
    with ThreadPoolExecutor(max_workers=4) as pool:
        for batch in _batches(files, batch_size):
            decoded = _decode_each(batch, classifier.preprocess, pool)
            failed += [d for d in decoded if isinstance(d, Failure)]
            good = [(p, d) for p, d in zip(batch, decoded, strict=True) if not isinstance(d, Failure)]
            if good:
                scores = classifier.scores(classifier.preprocess.to_input([d for _, d in good]))
                out += top_k(scores, classifier.class_names, k, [str(p) for p, _ in good])
    return out, failed


def predict(model: Path, images: Sequence[Path], *, top_k: int = 5, batch_size: int = 64, device: str = "auto",
            provider: str = "auto", open_learner: LearnerOpener | None = None) -> PredictReport:
    """Top-``top_k`` labels and probabilities of every readable image, in the order found (a learner
    directory through ``open_learner``, which the caller hands in); the files that could not be read or
    decoded are in the report's ``failed``.

    Raises:
        ConfigError: ``model`` is not a learner or ONNX file, or ``top_k``/``batch_size`` < 1.
        DataError: a missing path, no images, or no image that can be decoded (the first one's reason).
        ExportError: an ONNX file without sbcli metadata, onnxruntime missing, or the provider unavailable.
    """
    if top_k < 1 or batch_size < 1:
        raise ConfigError("--top-k and --batch-size must be at least 1.")
    files = find_images(images)
    classifier = open_classifier(Path(model), device=device, provider=provider, open_learner=open_learner)
    predictions, failed = predict_with(classifier, files, k=top_k, batch_size=batch_size)
    if not predictions:
        more = f" (and {len(failed) - 1} other files could not be read either)" if len(failed) > 1 else ""
        raise DataError(failed[0].error + more)
    return PredictReport(str(model), classifier.kind, classifier.provider, predictions, failed)
