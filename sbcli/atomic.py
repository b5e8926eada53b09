"""Replacing a file in one rename: readers see the old file or the new one, never half of one.

Written once for every file sbcli replaces beside its readers (the ONNX export, the decode cache,
the data whereabouts, a learner's results, the writer lock's note). The learner's own commit point
(:mod:`sbcli.learner.store.commit`) adds fsyncs and named crash points on top of the same idea.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

LOG = logging.getLogger(__name__)


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
    ``keep_suffix`` (for writers that choose the format by it, like matplotlib); where that would pass the
    file system's limit on a name (a 255-byte ``path``), the hidden part is a hash of the name (:func:`fitted`).
    """
    hidden = path.name if path.name.startswith(".") else f".{path.name}"  # starts with the name: leftovers are known
    tail = f".{os.getpid()}-{secrets.token_hex(4)}.tmp{path.suffix if keep_suffix else ''}"
    tmp = path.with_name(fitted(hidden, tail))  # hashed where the name is too long to take the tail
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


# ---------------------------------------------------------------------------------------------
# Names that fit, and staging folders that a later writer can prove were sbcli's
# ---------------------------------------------------------------------------------------------

NAME_MAX = 255  # bytes in one file name (ext4, xfs, btrfs, tmpfs, APFS)
STAGING_MARKER = ".sbcli-staging.json"
STAGED = "new"  # what the writer builds inside its staging folder, then moves onto the final name
STAGING_NAME = re.compile(r"\.(?P<base>.+)\.(?P<kind>[a-z0-9]+)-(?P<pid>[1-9][0-9]*)-(?P<token>[0-9a-f]{16})")


def fitted(name: str, tail: str) -> str:
    """``name`` followed by ``tail``, within :data:`NAME_MAX` bytes: when it would be longer, ``name`` is
    replaced by the first 16 hex digits of its SHA-256, hidden if it was (a name of sbcli's own fits wherever
    ``name`` does)."""
    whole = name + tail
    if len(os.fsencode(whole)) <= NAME_MAX:
        return whole
    return ("." if name.startswith(".") else "") + hashlib.sha256(os.fsencode(name)).hexdigest()[:16] + tail


def _host() -> str:
    return socket.gethostname()


def _alive(pid: int) -> bool:
    """A process with this id exists (on this machine); one we may not signal exists too."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def staging(final: Path, kind: str) -> Iterator[Path]:
    """A new hidden folder beside ``final`` for a writer to assemble what it installs; yields the path
    (inside it, not yet created) that the writer builds and then renames onto ``final``. The folder is
    removed at the end in every case; one that a SIGKILL left is removed by the next writer beside it
    (:func:`remove_orphans`).

    Its name is ``.FINAL.KIND-PID-TOKEN`` (FINAL hashed when that would not fit), and a marker written
    inside as it is created holds the same process id and token and this machine's name: what proves,
    later, that sbcli made the folder. Orphans beside ``final`` are removed before it is made.
    """
    parent = final.parent
    remove_orphans(parent)
    token = secrets.token_hex(8)
    box = parent / fitted("." + final.name.lstrip("."), f".{kind}-{os.getpid()}-{token}")
    box.mkdir()  # mode from the umask; a new name: never another writer's folder
    try:
        marker = {"pid": os.getpid(), "token": token, "host": _host(), "kind": kind, "for": final.name}
        with open(box / STAGING_MARKER, "x", encoding="utf-8") as f:
            json.dump(marker, f)
        yield box / STAGED
    finally:
        shutil.rmtree(box, ignore_errors=True)


def staging_owner(folder: Path) -> dict | None:
    """The marker of a staging folder sbcli made (its name and its marker agree), else None."""
    match = STAGING_NAME.fullmatch(folder.name)
    if match is None or folder.is_symlink() or not folder.is_dir():
        return None
    marker = folder / STAGING_MARKER
    try:
        if marker.is_symlink() or not marker.is_file() or marker.stat().st_size > 4096:
            return None
        data = json.loads(marker.read_text(encoding="utf-8"))
        entries = {p.name for p in folder.iterdir()}
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not entries <= {STAGING_MARKER, STAGED}:
        return None
    if data.get("pid") != int(match["pid"]) or data.get("token") != match["token"] or data.get("kind") != match["kind"]:
        return None
    return data


def remove_orphans(parent: Path) -> list[Path]:
    """Remove the staging folders in ``parent`` whose writer is gone: made by sbcli (:func:`staging_owner`),
    on this machine, by a process that no longer runs. A folder of anyone else's, whatever its name, and a
    live writer's are left alone. Returns what was removed."""
    removed = []
    try:
        candidates = [p for p in parent.iterdir() if p.name.startswith(".") and STAGING_NAME.fullmatch(p.name)]
    except OSError:
        return removed
    for folder in candidates:
        owner = staging_owner(folder)
        if owner is None or owner.get("host") != _host() or owner["pid"] == os.getpid() or _alive(owner["pid"]):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            LOG.info("Removed %s, left by an sbcli %s that was killed (process %s).", folder, owner["kind"], owner["pid"])
            removed.append(folder)
    return removed
