"""Where serving keeps what it derives from a learner or a model (exported ONNX files, TensorRT engines).

In order: ``$SBCLI_SERVE_CACHE`` when set (``sb serve --cache-dir`` sets it; it must be writable),
else ``$XDG_CACHE_HOME/sbcli/serve`` or ``~/.cache/sbcli/serve``; when that cannot be written (a
container's read-only root file system, a home that does not exist), a folder of this user's own
in the system's temporary folder (``$TMPDIR``, ``/tmp``: a tmpfs in most containers), used only
when it belongs to this user and no one else may write to it. Names in it are kept short enough
for any file system (:func:`entry_name`).
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from pathlib import Path

from sbcli.errors import ExportError

logger = logging.getLogger(__name__)
CACHE_ENV = "SBCLI_SERVE_CACHE"
NAME_BYTES = 96  # of a learner's name kept in a cache file's name: with the hash and suffix, far below 255 bytes
CONTAINER_HINT = (f"set {CACHE_ENV} (or `sb serve --cache-dir`) to a writable folder: in a container, a volume or a "
                  f"tmpfs mounted there (docker run --tmpfs /cache -e {CACHE_ENV}=/cache ...)")


def home_cache() -> Path:
    """$XDG_CACHE_HOME/sbcli/serve or ~/.cache/sbcli/serve."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "sbcli" / "serve"


def writable(folder: Path) -> bool:
    """``folder`` exists or could be made, and a file can be created in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            return True
    except (OSError, RuntimeError):  # RuntimeError: Path.home() without a home
        return False


def own_temp_cache() -> Path | None:
    """This user's folder in the temporary folder, made 0700; None when it cannot be, or is not safely ours."""
    folder = Path(tempfile.gettempdir()) / f"sbcli-serve-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = folder.lstat()
    except OSError:
        return None
    ours = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    if not stat.S_ISDIR(st.st_mode) or not ours or st.st_mode & 0o022:
        return None  # a link, someone else's folder, or one others may write to: never serve what it holds
    return folder if writable(folder) else None


def cache_dir() -> Path:
    """The serve cache (see the module's docstring), made if needed.

    Raises:
        ExportError: $SBCLI_SERVE_CACHE names a folder that cannot be written, or no place can be.
    """
    chosen = os.environ.get(CACHE_ENV)
    if chosen:
        folder = Path(chosen).expanduser()
        if not writable(folder):
            raise ExportError(f"{CACHE_ENV} is {folder}, which cannot be written; name a writable folder.")
        return folder
    try:
        home = home_cache()
    except RuntimeError:  # no home directory at all
        home = None
    if home is not None and writable(home):
        return home
    fallback = own_temp_cache()
    if fallback is None:
        raise ExportError(f"Serving a learner needs a writable cache for its exported model, and neither {home} nor the "
                          f"temporary folder can be written; {CONTAINER_HINT}.")
    logger.warning("The serve cache %s cannot be written (a read-only file system?); using %s instead", home, fallback)
    return fallback


def entry_name(name: str, key: str, suffix: str) -> str:
    """A cache file's name: ``name`` (cut to NAME_BYTES bytes of UTF-8, on a character boundary) joined to ``key``, so
    that a learner whose own name is 255 bytes long still has a cache file, and a temporary file beside it, that fit."""
    return f"{name.encode()[:NAME_BYTES].decode(errors='ignore')}-{key}{suffix}"
