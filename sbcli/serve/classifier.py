"""A model ready to score images: an ``sb export`` ONNX file in onnxruntime (no torch), or a
learner directory through the opener its caller hands in (:mod:`sbcli.export.serving`, PyTorch).
Both take the same input (see :mod:`sbcli.serve.preprocess`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from sbcli.errors import ConfigError, ExportError
from sbcli.serve import preprocess
from sbcli.serve.providers import open_session

KNOWN_FORMATS = ("1", "2")


@dataclass(frozen=True)
class OnnxMeta:
    """What a served model needs from an sbcli ONNX file's metadata."""

    class_names: list[str]
    image_size: int
    input_name: str
    output_name: str
    preprocess: preprocess.Preprocess
    raw: dict[str, str] = field(repr=False)

    def provenance(self) -> dict[str, Any]:
        """The metadata a client may want: provenance (JSON), method, inference rule, steps, versions."""
        out: dict[str, Any] = {}
        for key in ("sbcli_format", "sbcli_version", "method", "inference", "steps", "arch", "precision"):
            if key in self.raw:
                out[key] = self.raw[key]
        try:
            out["provenance"] = json.loads(self.raw.get("provenance", "{}"))
        except ValueError:
            out["provenance"] = self.raw.get("provenance")
        return out


def parse_metadata(raw: Mapping[str, str], input_name: str, output_name: str, source: str) -> OnnxMeta:
    """The metadata of an sbcli ONNX file (format 1 or 2).

    Raises:
        ExportError: no sbcli metadata, a newer format, or entries that are not the JSON expected.
    """
    raw = dict(raw)
    if "class_names" not in raw or "input_size" not in raw:
        raise ExportError(f"{source} has no sbcli metadata (class names, input size); export it with `sb export`.")
    fmt = raw.get("sbcli_format", "1")
    if fmt not in KNOWN_FORMATS:
        raise ExportError(f"{source} was written by a newer sbcli (metadata format {fmt}); upgrade sbcli to serve it.")
    try:
        names = [str(n) for n in json.loads(raw["class_names"])]
        size = int(json.loads(raw["input_size"])[-1])
    except (ValueError, TypeError, IndexError) as err:
        raise ExportError(f"{source} has unreadable class names or input size in its metadata ({err}); export it again.") from err
    return OnnxMeta(names, size, raw.get("input_name", input_name), output_name,
                    preprocess.from_metadata(raw, source), raw)


class Classifier(Protocol):
    """Anything that scores [B, 3, S, S] float32 images in [0, 1] over ``class_names``."""

    kind: str
    provider: str
    class_names: list[str]
    image_size: int
    preprocess: preprocess.Preprocess

    def scores(self, images: np.ndarray) -> np.ndarray: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass
class OnnxClassifier:
    """An ``sb export`` ONNX file, run in onnxruntime."""

    path: Path
    session: Any
    meta: OnnxMeta
    provider: str
    kind: str = "onnx"
    runner: Any = None  # sbcli.serve.gpu.BoundRunner with CUDA graphs; None: session.run

    @property
    def class_names(self) -> list[str]:
        return self.meta.class_names

    @property
    def image_size(self) -> int:
        return self.meta.image_size

    @property
    def preprocess(self) -> preprocess.Preprocess:
        return self.meta.preprocess

    def scores(self, images: np.ndarray) -> np.ndarray:
        if self.runner is not None:
            return self.runner.scores(images, len(self.class_names))
        return self.session.run([self.meta.output_name], {self.meta.input_name: images})[0]

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path), "provider": self.provider, "classes": self.class_names,
                "input_size": [3, self.image_size, self.image_size], "preprocess": self.preprocess.to_json(),
                **self.meta.provenance()}


def is_learner(path: Path) -> bool:
    return path.is_dir() and (path / "learner.json").is_file()


def is_onnx(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".onnx"


def open_onnx(path: Path, provider: str = "auto", threads: int | None = None, gpu: Any = None) -> OnnxClassifier:
    """An ONNX file written by ``sb export``, on the provider asked for (no torch imported); ``gpu``:
    :class:`sbcli.serve.gpu.GpuOptions` (CUDA graphs, TensorRT fp16 and engine cache).

    Raises:
        ExportError: no sbcli metadata, or the provider is missing or does not load.
        DataError: onnxruntime cannot read the file.
    """
    session, chosen = open_session(Path(path), provider, threads, gpu=gpu)
    meta = parse_metadata(session.get_modelmeta().custom_metadata_map, session.get_inputs()[0].name,
                          session.get_outputs()[0].name, str(path))
    runner = None
    if gpu is not None and gpu.cuda_graph and chosen == "cuda":
        from sbcli.serve.gpu import BoundRunner

        runner = BoundRunner(session, meta.input_name, meta.output_name)
    return OnnxClassifier(Path(path), session, meta, gpu.describe(chosen) if gpu is not None else chosen, runner=runner)


LearnerOpener = Callable[[Path, str], Classifier]  # (learner directory, device) -> a classifier; the caller's


def open_classifier(path: Path, *, device: str = "auto", provider: str = "auto",
                    open_learner: LearnerOpener | None = None) -> Classifier:
    """A learner directory (``open_learner`` on ``device``: the caller hands in the PyTorch side,
    :func:`sbcli.export.serving.open_learner`) or an ``.onnx`` file (onnxruntime on ``provider``).

    Raises:
        ConfigError: ``path`` is neither, or a learner directory and no ``open_learner`` was given.
    """
    path = Path(path)
    if is_onnx(path):
        return open_onnx(path, provider)
    if is_learner(path):
        if provider != "auto":
            raise ConfigError(f"--provider {provider} applies to .onnx files; {path} is a learner: use --device.")
        if open_learner is None:
            raise ConfigError(f"{path} is a learner directory; export it with `sb export` to score it here.")
        return open_learner(path, device)
    raise ConfigError(f"{path} is neither a learner directory (with learner.json) nor an .onnx file; give one of those.")
