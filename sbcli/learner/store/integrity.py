"""A learner vouches for its own bytes: every file it names is recorded in ``learner.json``.

``learner.json``'s ``hashes`` (format 3) maps every path a kept step names to its SHA-256 and size::

    "hashes": {"steps/0003/model.safetensors": {"sha256": "9f2c...", "size": 45731}, ...}

They are computed from the bytes a save writes (no second pass over them) and checked when a file is
read, in the same pass that reads it (:func:`read_verified`): the size first, from ``fstat``, so a
file of the wrong size is refused before a byte of it is read, then the SHA-256 of the bytes as they
are read. A step folder copied from another learner, a flipped bit in tensor data, a truncated or
zeroed tail: each is refused in one sentence naming the file, before anything is built from it.

A learner of format 1 or 2 records no hashes; it is read as before, and its next save records them
(hashing the files it keeps, once each).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from sbcli.errors import LearnerError

HASHES_KEY = "hashes"
CHUNK = 1 << 20
HEX64 = re.compile(r"[0-9a-f]{64}")
MAX_FILE_BYTES = 1 << 44
RESTORE = "restore the learner from a copy or pull it again"

Record = dict[str, Any]  # {"sha256": str, "size": int}


def digest_bytes(data: bytes) -> Record:
    """The record of bytes about to be written (they are hashed in memory, never read back)."""
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def digest_file(path: Path) -> Record:
    """The record of a file already on disk (an older learner's kept files, at their first hashed save)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"sha256": digest.hexdigest(), "size": size}


def parse_hashes(value: Any, referenced: set[str], where: Path, required: bool) -> dict[str, Record]:
    """``learner.json``'s ``hashes``, checked: one record per named file (every one when ``required``).

    Raises:
        LearnerError: a malformed record, a record of a file no step names, or a named file without one.
    """
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise LearnerError(f"{where} is damaged: hashes must be an object from file paths to their SHA-256 and size; "
                           f"{RESTORE}.")
    out: dict[str, Record] = {}
    for rel, record in value.items():
        if rel not in referenced:
            raise LearnerError(f"{where} is damaged: hashes records {rel!r}, a file no kept step names; {RESTORE}.")
        if not (isinstance(record, dict) and set(record) == {"sha256", "size"} and isinstance(record["sha256"], str)
                and HEX64.fullmatch(record["sha256"]) and type(record["size"]) is int
                and 0 <= record["size"] <= MAX_FILE_BYTES):
            raise LearnerError(f"{where} is damaged: the hash of {rel} is not a SHA-256 (64 hex digits) and a size; "
                               f"{RESTORE}.")
        out[rel] = {"sha256": record["sha256"], "size": record["size"]}
    unrecorded = sorted(referenced - set(out)) if required else []
    if unrecorded:
        raise LearnerError(f"{where} is damaged: it records no hash of {unrecorded[0]}; {RESTORE}.")
    return out


def mismatch(path: Path, problem: str) -> LearnerError:
    return LearnerError(f"{path} is not the file learner.json recorded ({problem}): it was changed, truncated or "
                        f"copied from another learner after it was saved; {RESTORE}.")


def read_verified(path: Path, record: Record | None) -> bytearray:
    """The bytes of ``path``, read once; checked against ``record`` (size, then SHA-256) when there is one.

    The file is opened without following a symbolic link. Raises FileNotFoundError when it is not
    there (a reader that lost a race with a writer reads learner.json again), LearnerError otherwise.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise
    except OSError as err:
        raise LearnerError(f"Could not read {path} ({err.strerror or err}); check its permissions, and that it is a "
                           "file, not a symbolic link.") from err
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if record is not None and size != record["size"]:
            raise mismatch(path, f"it is {size} bytes, learner.json recorded {record['size']}")
        digest, data = hashlib.sha256(), bytearray()
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            data += chunk
    if len(data) != size:
        raise LearnerError(f"{path} changed while it was being read; {RESTORE}.")
    if record is not None and digest.hexdigest() != record["sha256"]:
        raise mismatch(path, "its SHA-256 differs")
    return data


def records_for(root: Path, referenced: set[str], known: dict[str, Record]) -> dict[str, Record]:
    """A record for every path in ``referenced``: ``known`` ones kept, the others hashed from disk once."""
    return {rel: known[rel] if rel in known else digest_file(root / rel) for rel in sorted(referenced)}
