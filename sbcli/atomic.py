"""Replacing a file in one rename: readers see the old file or the new one, never half of one.

Written once for every file sbcli replaces beside its readers (the ONNX export, the decode cache,
the data whereabouts, a learner's results, the writer lock's note). The learner's own commit point
(:mod:`sbcli.learner.store.commit`) adds fsyncs and named crash points on top of the same idea.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def current_umask() -> int:
    """This process's umask, read without changing it where Linux shows it (else set and restored)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A new temporary file beside ``path`` (same suffix, mode from the umask) for the block to write;
    renamed onto ``path`` when the block ends without an error, removed in every case otherwise."""
    hidden = path.name if path.name.startswith(".") else f".{path.name}"  # starts with the name: leftovers are known
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f"{hidden}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; follow the umask like open() does
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) in one rename."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
