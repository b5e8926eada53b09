"""The model versions ``sb serve`` answers on the inference protocol: versions are learner steps.

* a learner directory: every kept step up to the current one. The current step (the model
  ``/predict`` serves) is exported and served first, so the server is ready in the time of one
  export and one listing of the steps (no export when the cache holds it). Each other kept step is opened from the serve cache when
  an earlier run exported it (the cache is keyed by the step's own bytes), and otherwise listed as
  *pending*: the first request for it exports it (by the exporter the caller names) and waits for
  it; later ones find it loaded;
* a Triton model folder from ``sb export --format triton``: each numbered version in it;
* an ``.onnx`` file: the step it was exported from (its ``steps`` metadata); a file replaced by
  one of a later step adds a version, by one of the same step replaces it.

The default version is the latest. A reload (the source changed) adds the new step's version
beside the others: requests already holding a model finish on it. Every model is warmed (one
call) before it is listed, so ``ready`` means a request will not wait for a first-call setup.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sbcli.serve.classifier import OnnxClassifier, is_learner, open_onnx
from sbcli.serve.source import Loaded, exporter_of, is_triton_model, model_name, triton_versions

logger = logging.getLogger(__name__)


def step_of(model: OnnxClassifier, fallback: int) -> int:
    """The learner step an ONNX file was exported from (``fallback`` for files without it)."""
    try:
        return int(model.meta.raw.get("steps", fallback)) or fallback
    except ValueError:
        return fallback


def warm(model: OnnxClassifier) -> None:
    """One call on a black image, so that the first request does not pay onnxruntime's setup."""
    model.scores(np.zeros((1, 3, model.image_size, model.image_size), np.float32))


class PendingVersion(Exception):  # noqa: N818  (a state, not a failure: the caller exports it)
    """A kept step listed but not exported yet: :meth:`Registry.export_pending` makes it a version."""

    def __init__(self, number: int) -> None:
        super().__init__(f"version {number} is not exported yet")
        self.number = number


@dataclass
class Registry:
    """The versions served, by number, and the learner steps listed but not exported yet (``pending``: step -> its
    files); ``failing`` holds why the last change could not be served."""

    source: Path
    provider: str = "auto"
    threads: int | None = None
    gpu: Any = None  # sbcli.serve.gpu.GpuOptions
    exporter: str | None = None  # the module that exports a learner's steps (sbcli.serve.source.LearnerExporter)
    versions: dict[int, OnnxClassifier] = field(default_factory=dict)
    pending: dict[int, dict[str, str]] = field(default_factory=dict)
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

    @property
    def numbers(self) -> list[int]:
        """Every version listed: loaded, or pending (exported on its first request)."""
        return sorted({*self.versions, *self.pending})

    def get(self, version: str | None) -> tuple[int, OnnxClassifier]:
        """The version asked for (default: the latest).

        Raises:
            KeyError: naming the versions served.
            PendingVersion: a kept step not exported yet (:meth:`export_pending`).
        """
        if not self.versions:
            raise KeyError("no version is loaded yet")
        if version is None or version == "":
            return self.latest, self.versions[self.latest]
        if version.isdigit() and int(version) in self.pending and int(version) not in self.versions:
            raise PendingVersion(int(version))
        if not version.isdigit() or int(version) not in self.versions:
            raise KeyError(f"version {version} is not served (versions: {', '.join(map(str, self.numbers))})")
        return int(version), self.versions[int(version)]

    def export_pending(self, number: int) -> None:
        """Export kept step ``number`` and serve it as a version (blocking: the exporter's child interpreter)."""
        files = self.pending.get(number)
        if files is None:
            return  # exported meanwhile, or no longer kept
        exporter = exporter_of(self.exporter, self.source)
        start = time.perf_counter()
        model = open_onnx(exporter.step_onnx(self.source, number, files), self.provider, self.threads, self.gpu)
        warm(model)
        logger.debug("Version %d of %s exported and ready in %.2f s", number, self.source, time.perf_counter() - start)
        self.versions = {**self.versions, number: model}  # one assignment each: a request sees the old or the new
        self.pending = {n: f for n, f in self.pending.items() if n != number}

    def number(self, model: OnnxClassifier) -> int:
        """The version ``model`` is served as (before the first listing: the step it was exported from)."""
        return next((n for n, m in self.versions.items() if m is model), step_of(model, 1))

    def sync(self, loaded: Loaded) -> None:
        """Serve what ``loaded`` (the model ``/predict`` now serves) and its source hold; blocking (loads; a learner's
        other steps are listed, and opened only where the cache holds them)."""
        if loaded is self.synced:
            return
        if is_learner(self.source):
            self._sync_learner(loaded)
            return
        found = self._found(loaded)
        for number, model in found.items():
            if self.versions.get(number) is not model:
                warm(model)
        self.versions = found  # one assignment: a request sees the old dict or the new one
        self.synced = loaded

    def _sync_learner(self, loaded: Loaded) -> None:
        """The current step, and the other kept steps listed (one child interpreter): opened from the cache, or pending;
        none is exported here."""
        current = step_of(loaded.model, loaded.version)
        if self.versions.get(current) is not loaded.model:
            warm(loaded.model)
        exporter = exporter_of(self.exporter, self.source)
        found, pending = {}, {}
        for number, files in sorted(exporter.kept_steps(self.source).items()):
            if number == current:
                found[number] = loaded.model
            elif number in self.versions:
                found[number] = self.versions[number]
            elif (cached := exporter.cached_step_onnx(self.source, number, files)) is not None:
                found[number] = open_onnx(cached, self.provider, self.threads, self.gpu)
                warm(found[number])
            else:
                pending[number] = files
        found.setdefault(current, loaded.model)
        logger.debug("Versions of %s: %s served (%d current), %s exported on first request", self.source,
                     ", ".join(map(str, sorted(found))), current, ", ".join(map(str, sorted(pending))) or "none")
        self.versions, self.pending = found, pending
        self.synced = loaded

    def _found(self, loaded: Loaded) -> dict[int, OnnxClassifier]:
        current = step_of(loaded.model, loaded.version)
        if is_triton_model(self.source):
            paths = triton_versions(self.source)
            top = max(paths)
            out = {n: self.versions[n] for n in paths if n in self.versions and n != top}
            out.update({n: open_onnx(p, self.provider, self.threads, self.gpu) for n, p in paths.items() if n not in out and n != top})
            out[top] = loaded.model
            return dict(sorted(out.items()))
        return {**self.versions, current: loaded.model}  # a file exported again from the same step replaces it
