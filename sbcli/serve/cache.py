"""Where serving keeps what it derives from a learner or a model (exported ONNX files, TensorRT engines)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where learner directories are exported for serving: $XDG_CACHE_HOME/sbcli/serve or ~/.cache/sbcli/serve."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "sbcli" / "serve"
