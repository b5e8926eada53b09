"""Helpers for tests that damage a learner's files: find them, hash them, rewrite safetensors raw."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path


def learner_files(learner: Path) -> dict[str, Path]:
    """learner.json and the model and memory files of the current step (format 1 or 2)."""
    state = json.loads((learner / "learner.json").read_text(encoding="utf-8"))
    named = state.get("files") or {}
    return {"json": learner / "learner.json",
            "model": learner / named.get("model", "model.safetensors"),
            "memory": learner / named.get("memory", "memory.safetensors")}


def hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file below ``folder`` (the writer's lock file aside)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(".sbcli.lock")}


def read_raw(path: Path) -> tuple[dict, bytes]:
    """(header, data) of a safetensors file, without interpreting the tensors."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_raw(path: Path, header: dict, data: bytes, length: int | None = None) -> None:
    """A safetensors file from a header and data (``length``: a header length to claim instead of the real one)."""
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)


def rehash(learner: Path) -> None:
    """Re-record in learner.json the hashes of files changed on disk, as a crafted learner would: so
    that the structural checks behind the hashes are what a test exercises. learner.json is left
    byte for byte as it is when no record changes (or when it is not a JSON object with hashes)."""
    path = learner / "learner.json"
    try:
        state = json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        return
    records = state.get("hashes") if isinstance(state, dict) else None
    if not isinstance(records, dict):
        return
    _record_state(learner, state)
    changed = False
    for rel in list(records):
        file = learner / rel
        if isinstance(rel, str) and file.is_file():
            raw = file.read_bytes()
            record = {"sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw)}
            changed |= records[rel] != record
            records[rel] = record
    if changed:
        path.write_text(json.dumps(state, indent=2, allow_nan=True))


def _record_state(learner: Path, state: dict) -> None:
    """Write the current step's state.json as learner.json says it (without the storage keys), as a
    crafted learner would, so that learner.json agrees with the step's record it is compared with."""
    files = state.get("files")
    rel = files.get("state") if isinstance(files, dict) else None
    if not isinstance(rel, str) or not (learner / rel).is_file():
        return
    record = {k: v for k, v in state.items() if k not in ("files", "kept_steps", "keep", "hashes", "objects")}
    (learner / rel).write_text(json.dumps(record, indent=2, allow_nan=True) + "\n")
