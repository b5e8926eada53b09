"""What ``sb serve`` serves, and its reload: an ``.onnx`` file, or a learner directory exported to
a cached ONNX file by the exporter its caller names (only that export imports torch).

The watcher polls a signature (the file's, or the learner's ``learner.json``: its commit point):
when it changed and stayed the same for one more poll (so a file still being written is not
read), the new model is loaded beside the old one and swapped in; requests already running finish
on the old one. A new model that fails to load is logged and the old one keeps serving.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sbcli.errors import ConfigError
from sbcli.serve.model import OnnxClassifier, is_learner, is_onnx, open_onnx

logger = logging.getLogger(__name__)
Signature = tuple[int, int, int] | None


def signature(source: Path) -> Signature:
    """(inode, size, mtime) of the ONNX file or of the learner's learner.json; None while absent."""
    target = source / "learner.json" if source.is_dir() else source
    try:
        st = os.stat(target)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def cache_dir() -> Path:
    """Where learner directories are exported for serving: $XDG_CACHE_HOME/sbcli/serve or ~/.cache/sbcli/serve."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "sbcli" / "serve"


def exporter_of(spec: str) -> Callable[[Path], Path]:
    """The exporter named ``module:function`` (``sbcli.export.serving:learner_onnx`` from the CLI)."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def check_source(source: Path) -> None:
    """Raises ConfigError when ``source`` is neither an .onnx file nor a learner directory."""
    if not (is_onnx(source) or is_learner(source)):
        raise ConfigError(f"{source} is neither a learner directory (with learner.json) nor an .onnx file; give one of those.")


@dataclass
class Loaded:
    """The model now served, its version (1, 2, ... per reload) and the signature it was loaded at."""

    model: OnnxClassifier
    version: int
    signature: Signature


def load(source: Path, provider: str, threads: int | None = None, version: int = 1,
         exporter: str | None = None) -> Loaded:
    """Open ``source`` on ``provider``; a learner directory is first exported by ``exporter``
    (``module:function``, from a learner directory to an ONNX file; the caller names it).

    Raises:
        ConfigError: ``source`` is neither an .onnx file nor a learner directory, or a learner and no exporter.
    """
    check_source(source)
    sig = signature(source)
    if source.is_dir() and exporter is None:
        raise ConfigError(f"{source} is a learner directory; export it with `sb export` and serve the .onnx file.")
    path = exporter_of(exporter)(source) if source.is_dir() else source
    return Loaded(open_onnx(path, provider, threads), version, sig)


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
