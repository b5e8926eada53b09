"""What ``sb serve`` serves, and its reload: an ``.onnx`` file, a Triton model folder written by
``sb export --format triton`` (its latest numbered version), or a learner directory exported to a
cached ONNX file by the exporter its caller names (only that export imports torch); a Triton model
repository (a folder of Triton model folders) stands for every model in it (:func:`expand`).

The watcher polls a signature (the file's, or the learner's ``learner.json``: its commit point):
when it changed and stayed the same for one more poll (so a file still being written is not
read), the new model is loaded beside the old one and swapped in; requests already running finish
on the old one. A new model that fails to load is logged and the old one keeps serving.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sbcli.errors import ConfigError
from sbcli.serve.classifier import OnnxClassifier, is_learner, is_onnx, open_onnx

logger = logging.getLogger(__name__)
Signature = tuple[int, int, int] | None
# The modules a caller may name as the exporter: serve's only import by name (a name, so that each
# --workers process finds it again; tests/test_layout.py checks that the CLI may import each).
EXPORTERS = ("sbcli.export.serving",)


def triton_versions(folder: Path) -> dict[int, Path]:
    """The numbered versions of a Triton model folder (``N/model.onnx``). ``config.pbtxt`` may be absent: Triton
    completes an ONNX model's configuration itself, and so does sb serve (its configuration is always made from the
    model, :func:`sbcli.serve.oip_triton.model_config`)."""
    if not folder.is_dir() or (folder / "learner.json").is_file():
        return {}
    return {int(d.name): d / "model.onnx" for d in folder.iterdir()
            if d.name.isdigit() and int(d.name) > 0 and (d / "model.onnx").is_file()}


def is_triton_model(path: Path) -> bool:
    return path.is_dir() and bool(triton_versions(path))


def repository_models(folder: Path) -> dict[str, Path]:
    """The Triton model folders of a model repository (``NAME/N/model.onnx``, with or without ``NAME/config.pbtxt``),
    by name; hidden folders (an export still being written) are not models."""
    if not folder.is_dir() or (folder / "config.pbtxt").is_file() or triton_versions(folder) or (folder / "learner.json").is_file():
        return {}
    return {d.name: d for d in sorted(folder.iterdir()) if not d.name.startswith(".") and is_triton_model(d)}


def is_triton_repository(path: Path) -> bool:
    return bool(repository_models(path))


def model_name(source: Path) -> str:
    """The protocol's model name: the learner's or Triton folder's name, or the .onnx file's stem."""
    raw = source.resolve().name if source.is_dir() else source.stem
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip(".-") or "sbcli-model"


def expand(sources: Sequence[Path]) -> dict[str, Path]:
    """Every model the sources name, by name, in the order given (a repository's models by name).

    Raises:
        ConfigError: a source is none of what can be served, or two sources would serve models of one name.
    """
    found: dict[str, Path] = {}
    for source in map(Path, sources):
        for path in list(repository_models(source).values()) or [source]:
            check_source(path)
            name = model_name(path)
            if name in found:
                raise ConfigError(f"Two models would be served as {name!r} ({found[name]} and {path}); "
                                  "serve them from folders or files of different names.")
            found[name] = path
    return found


def signature(source: Path) -> Signature:
    """(inode, size, mtime) of the ONNX file, of a Triton folder's latest version or of the learner's
    learner.json; None while absent."""
    versions = triton_versions(source) if source.is_dir() else {}
    target = versions[max(versions)] if versions else source / "learner.json" if source.is_dir() else source
    try:
        st = os.stat(target)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class LearnerExporter(Protocol):
    """What serving a learner directory needs from the torch side (the module the caller names)."""

    def learner_onnx(self, learner_dir: Path) -> Path:
        """The learner's current step as an ONNX file (in the serve cache)."""

    def kept_steps(self, learner_dir: Path) -> dict[int, dict[str, str]]:
        """The kept steps up to the current one, with their files."""

    def step_onnx(self, learner_dir: Path, step: int, files: dict[str, str]) -> Path:
        """Kept step ``step`` as an ONNX file (in the serve cache)."""

    def cached_step_onnx(self, learner_dir: Path, step: int, files: dict[str, str]) -> Path | None:
        """Kept step ``step``'s ONNX file when the serve cache holds it already (found in this process: no export)."""


def exporter_of(spec: str | None, source: Path) -> LearnerExporter:
    """The exporter module named ``spec`` (one of :data:`EXPORTERS`), for the learner at ``source``.

    Raises:
        ConfigError: no exporter was named, or one that is not in :data:`EXPORTERS`.
    """
    if spec is None:
        raise ConfigError(f"{source} is a learner directory; export it with `sb export` and serve the .onnx file.")
    if spec not in EXPORTERS:
        raise ConfigError(f"{spec} is not an exporter sbcli serves a learner with; name one of {', '.join(EXPORTERS)}.")
    return importlib.import_module(spec)


def check_source(source: Path) -> None:
    """Raises ConfigError when ``source`` is neither an .onnx file nor a learner directory."""
    if not (is_onnx(source) or is_learner(source) or is_triton_model(source)):
        raise ConfigError(f"{source} is neither a learner directory (with learner.json) nor an .onnx file (nor a Triton "
                          "model folder or model repository from `sb export --format triton`); give one of those.")


@dataclass
class Loaded:
    """The model now served, its version (1, 2, ... per reload) and the signature it was loaded at."""

    model: OnnxClassifier
    version: int
    signature: Signature


def load(source: Path, provider: str, threads: int | None = None, version: int = 1, gpu: Any = None,
         exporter: str | None = None) -> Loaded:
    """Open ``source`` on ``provider`` (``gpu``: its GPU options, :mod:`sbcli.serve.gpu`); a learner directory
    is first exported by ``exporter`` (a module implementing :class:`LearnerExporter`; the caller names it).

    Raises:
        ConfigError: ``source`` is none of what can be served, or a learner directory and no exporter.
    """
    check_source(source)
    sig = signature(source)
    if is_triton_model(source):
        versions = triton_versions(source)
        path = versions[max(versions)]
    elif source.is_dir():
        path = exporter_of(exporter, source).learner_onnx(source)
    else:
        path = source
    return Loaded(open_onnx(path, provider, threads, gpu), version, sig)


@dataclass
class Watcher:
    """Decides, poll by poll, when to reload: after a change that held still for one poll."""

    source: Path
    current: Signature
    _seen: Signature = None
    _failed: Signature = None

    def due(self) -> bool:
        sig = signature(self.source)
        if sig is None or sig in (self.current, self._failed):
            self._seen = None
            return False
        ready = sig == self._seen
        self._seen = sig
        return ready

    def failed(self) -> None:
        """The change could not be loaded: ignore it until the source changes again."""
        self._failed = self._seen
        self._seen = None
