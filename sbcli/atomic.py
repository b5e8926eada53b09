"""Replacing a file in one rename: readers see the old file or the new one, never half of one.

Written once for every file sbcli replaces beside its readers (the ONNX export, the decode cache,
the data whereabouts, a learner's results, the writer lock's note). The learner's own commit point
(:mod:`sbcli.learner.store.commit`) adds fsyncs and named crash points on top of the same idea.
"""

from __future__ import annotations

import contextlib
import os
import secrets
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
def replacing(path: Path, keep_suffix: bool = False) -> Iterator[Path]:
    """A new temporary file beside ``path`` (mode from the umask, as ``open`` gives) for the block to write;
    renamed onto ``path`` when the block ends without an error, removed in every case otherwise.

    Its name starts with ``path``'s (hidden) and ends in ``.tmp``, or in ``path``'s own suffix with
    ``keep_suffix`` (for writers that choose the format by it, like matplotlib).
    """
    hidden = path.name if path.name.startswith(".") else f".{path.name}"  # starts with the name: leftovers are known
    tmp = path.with_name(f"{hidden}.{os.getpid()}-{secrets.token_hex(4)}.tmp{path.suffix if keep_suffix else ''}")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # a new name: never another writer's file
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) in one rename."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
