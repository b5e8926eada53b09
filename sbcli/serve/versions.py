"""The model versions ``sb serve`` answers on the inference protocol: versions are learner steps.

* a learner directory: every kept step up to the current one (each exported once to the serve
  cache, by the exporter the caller names; the current step is the model ``/predict`` serves);
* a Triton model folder from ``sb export --format triton``: each numbered version in it;
* an ``.onnx`` file: the step it was exported from (its ``steps`` metadata); a file replaced by
  one of a later step adds a version, by one of the same step replaces it.

The default version is the latest. A reload (the source changed) adds the new step's version
beside the others: requests already holding a model finish on it. Every model is warmed (one
call) before it is listed, so ``ready`` means a request will not wait for a first-call setup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sbcli.serve.model import OnnxClassifier, is_learner, open_onnx
from sbcli.serve.source import Loaded, exporter_of, is_triton_model, model_name, triton_versions


def step_of(model: OnnxClassifier, fallback: int) -> int:
    """The learner step an ONNX file was exported from (``fallback`` for files without it)."""
    try:
        return int(model.meta.raw.get("steps", fallback)) or fallback
    except ValueError:
        return fallback


def warm(model: OnnxClassifier) -> None:
    """One call on a black image, so that the first request does not pay onnxruntime's setup."""
    model.scores(np.zeros((1, 3, model.image_size, model.image_size), np.float32))


@dataclass
class Registry:
    """The versions served, by number; ``failing`` holds why the last change could not be served."""

    source: Path
    provider: str = "auto"
    threads: int | None = None
    gpu: Any = None  # sbcli.serve.gpu.GpuOptions
    exporter: str | None = None  # the module that exports a learner's steps (sbcli.serve.source.LearnerExporter)
    versions: dict[int, OnnxClassifier] = field(default_factory=dict)
    failing: str | None = None
    synced: Loaded | None = None

    @property
    def name(self) -> str:
        return model_name(self.source)

    @property
    def latest(self) -> int:
        return max(self.versions)

    @property
    def ready(self) -> bool:
        return bool(self.versions) and self.failing is None

    def get(self, version: str | None) -> tuple[int, OnnxClassifier]:
        """The version asked for (default: the latest). Raises KeyError naming the versions served."""
        if not self.versions:
            raise KeyError("no version is loaded yet")
        if version is None or version == "":
            return self.latest, self.versions[self.latest]
        if not version.isdigit() or int(version) not in self.versions:
            raise KeyError(f"version {version} is not served (versions: {', '.join(map(str, sorted(self.versions)))})")
        return int(version), self.versions[int(version)]

    def number(self, model: OnnxClassifier) -> int:
        """The version ``model`` is served as (before the first listing: the step it was exported from)."""
        return next((n for n, m in self.versions.items() if m is model), step_of(model, 1))

    def sync(self, loaded: Loaded) -> None:
        """Serve what ``loaded`` (the model ``/predict`` now serves) and its source hold; blocking (exports, loads)."""
        if loaded is self.synced:
            return
        found = self._found(loaded)
        for number, model in found.items():
            if self.versions.get(number) is not model:
                warm(model)
        self.versions = found  # one assignment: a request sees the old dict or the new one
        self.synced = loaded

    def _found(self, loaded: Loaded) -> dict[int, OnnxClassifier]:
        current = step_of(loaded.model, loaded.version)
        if is_learner(self.source):
            exporter, out = exporter_of(self.exporter, self.source), {}
            for number, files in sorted(exporter.kept_steps(self.source).items()):
                if number == current:
                    out[number] = loaded.model
                elif number in self.versions:
                    out[number] = self.versions[number]
                else:
                    out[number] = open_onnx(exporter.step_onnx(self.source, number, files), self.provider, self.threads, self.gpu)
            return out
        if is_triton_model(self.source):
            paths = triton_versions(self.source)
            top = max(paths)
            out = {n: self.versions[n] for n in paths if n in self.versions and n != top}
            out.update({n: open_onnx(p, self.provider, self.threads, self.gpu) for n, p in paths.items() if n not in out and n != top})
            out[top] = loaded.model
            return dict(sorted(out.items()))
        return {**self.versions, current: loaded.model}  # a file exported again from the same step replaces it
