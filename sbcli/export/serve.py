"""Moved to :mod:`sbcli.serve` (preprocessing, providers, predict, the HTTP server); kept so that
``sbcli.api.predict`` and older imports keep working."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sbcli.serve import predict as _predict
from sbcli.serve.model import Classifier, OnnxClassifier, TorchClassifier, open_classifier
from sbcli.serve.predict import Prediction, PredictReport, decode, find_images, softmax

__all__ = ["Classifier", "OnnxClassifier", "PredictReport", "Prediction", "TorchClassifier", "decode", "find_images",
           "open_classifier", "predict", "softmax"]


def predict(model: Path, images: Sequence[Path], *, top_k: int = 5, batch_size: int = 64, device: str = "auto",
            provider: str = "auto") -> list[Prediction]:
    """The predictions of :func:`sbcli.serve.predict.predict` (without the model and provider)."""
    return _predict.predict(model, images, top_k=top_k, batch_size=batch_size, device=device,
                            provider=provider).predictions
