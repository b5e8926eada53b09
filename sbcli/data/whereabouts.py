"""Where this machine last saw a data set, by its content hash; kept in the user's cache, never in a learner.

A learner records its test sets by name and fingerprint only (``sbcli.data.source_records``). So that
``sb evaluate`` on the machine that trained still finds the original test folders wherever the
command runs from, training remembers ``sha256 -> absolute path`` here, one small JSON file per
data set, under the decode cache (``$SBCLI_CACHE``, else ``~/.cache/sbcli/decoded``). A path
found here is only a candidate: it is used when what it holds still has the recorded fingerprint.
"""

from __future__ import annotations

import json
from pathlib import Path

from sbcli.atomic import write_atomic
from sbcli.data.sources import DecodeCache

FOLDER = "whereabouts"


def _file(sha256: str, cache: Path | None) -> Path:
    base = cache if cache is not None else DecodeCache.default().directory
    return base / FOLDER / f"{sha256}.json"


def remember(sha256: str, path: Path, cache: Path | None = None) -> None:
    """Note that the data set with this hash is at ``path`` (written atomically)."""
    target = _file(sha256, cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, json.dumps({"path": str(Path(path).resolve())}))


def recall(sha256: str, cache: Path | None = None) -> Path | None:
    """Where the data set with this hash was last seen, if that path still exists."""
    target = _file(sha256, cache)
    try:
        path = Path(json.loads(target.read_text(encoding="utf-8"))["path"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # never written, or a damaged note: nothing remembered
    return path if path.exists() else None
