"""The learner directory's layout (format 3: format 2 plus the file hashes) and how to read what is committed in it.

```
LEARNER/
  learner.json                  the commit point: the current state, the files of every kept step, their hashes
  steps/0003/model.safetensors  per-step files, immutable once written
  steps/0003/memory.safetensors
  steps/0003/state.json         the state (learner.json without the storage keys) at that step
  steps/0002/...                earlier kept steps (``--keep N``), for ``--step N`` and ``sb rollback``
  .sbcli.lock, .sbcli.lock.json the writer lock and who holds it (never pushed)
```

A learner published to the Hub has one step with its files at the root (``model.safetensors``,
``memory.safetensors``; its state is ``learner.json`` itself), which ``files`` names the same way.
Format 1 (files at the root, no ``files`` key) is still read: it has one step, the current one.

A reader reads ``learner.json`` once, then only the files it names, under two rules:

- **Confined**: a learner is confined to its own directory, no symbolic link inside it is followed. A
  ``steps/`` folder, a step folder or a file that is a link could make a reader read another learner's
  files, and a writer (which deletes the step folders ``learner.json`` no longer names) delete folders
  elsewhere. So every command refuses a learner holding a link, in one sentence, before it reads or
  writes anything there: :func:`check_confined` looks (``lstat``, never following a link) at the
  entries of the learner's root and everything below ``steps/``. The learner's path itself may be a
  link; it is resolved once, and nothing is written outside that resolved directory.
- **Vouched for**: every file a kept step names is recorded in ``learner.json``'s ``hashes`` (format 3),
  its SHA-256 and size::

    "hashes": {"steps/0003/model.safetensors": {"sha256": "9f2c...", "size": 45731}, ...}

  They are computed from the bytes a save writes (no second pass over them) and checked when a file
  is read, in the same pass that reads it (:func:`read_verified`): the size first, from ``fstat``, so
  a file of the wrong size is refused before a byte of it is read, then the SHA-256 of the bytes as
  they are read. A step folder copied from another learner, a flipped bit in tensor data, a truncated
  or zeroed tail: each is refused in one sentence naming the file, before anything is built from it.
  A learner of format 1 or 2 records no hashes; it is read as before, and its next save records them
  (hashing the files it keeps, once each).
- **Stored once** (format 4): a step file's large tensors are blocks under ``objects/``, each named by
  its SHA-256 (:mod:`sbcli.learner.store.objects`), so what did not change between steps (a frozen
  backbone, a projection, earlier tasks' carried test images) is one file referenced by every step.
  ``learner.json``'s ``objects`` lists the blocks of each kept step; each is in ``hashes`` too, and a
  reader checks a block against its name as it reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from sbcli.errors import LearnerError
from sbcli.jsonutil import strict
from sbcli.learner.store.objects import OBJECTS_DIR, assemble, object_path, refs
from sbcli.learner.validate import RESTORE, check_format_version, check_state_json

FORMAT_VERSION = 4  # 3: format 2 plus "hashes" (every named file's SHA-256 and size); 4: plus "objects"
HASHED_SINCE = 3
OBJECTS_SINCE = 4
HASHES_KEY = "hashes"
OBJECTS_KEY = "objects"  # per kept step: the SHA-256 of every block its files name (sbcli.learner.store.objects)
STATE_FILE = "learner.json"
STEPS_DIR = "steps"
LOCK_FILE = ".sbcli.lock"
LOCK_INFO = ".sbcli.lock.json"
TMP_PREFIX = f"{STATE_FILE}.tmp-"

# The files of one step: (key in learner.json's "files", name inside the step folder, required).
# A new per-step file is one more row; an optional one may be absent from a step.
STEP_FILES: tuple[tuple[str, str, bool], ...] = (
    ("model", "model.safetensors", True),
    ("memory", "memory.safetensors", True),
    ("test_sample", "test-sample.safetensors", False),  # travel: the carried test sample (sbcli.learner.test_sample)
    ("state", "state.json", False),  # absent only for a published learner's one step
)
# Format 1: the files of its only step, at the root (its state is learner.json itself).
V1_FILES = {"model": "model.safetensors", "memory": "memory.safetensors"}
STORAGE_KEYS = ("files", "kept_steps", "keep", HASHES_KEY, OBJECTS_KEY)
STEP_DIR = re.compile(r"\d{4,}(-\d+)?")
CHUNK = 1 << 20  # files are hashed as they are read, a MiB at a time
HEX64 = re.compile(r"[0-9a-f]{64}")
MAX_FILE_BYTES = 1 << 44

Record = dict[str, Any]  # a file's hash record: {"sha256": str, "size": int}


def linked_entry(root: Path) -> Path | None:
    """The first symbolic link in the learner at ``root`` (its root entries, everything under ``steps/``)."""
    if not root.is_dir():
        return None
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            listing = os.scandir(folder)
        except FileNotFoundError:
            if folder == root:
                raise
            continue  # renamed or removed since it was listed: a writer holding the lock is committing a step
        with listing as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_symlink():
                    return Path(entry.path)
                inside_steps = folder != root or entry.name in (STEPS_DIR, OBJECTS_DIR)
                if inside_steps and entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
    return None


def check_confined(root: Path) -> None:
    """Refuse a learner that holds a symbolic link (one sentence naming it).

    Raises:
        LearnerError: a link inside the learner.
    """
    try:
        link = linked_entry(root)
    except OSError as err:
        raise LearnerError(f"Could not list the learner at {root} ({err.strerror or err}); check its permissions.") from err
    if link is not None:
        rel = link.relative_to(root).as_posix()
        raise LearnerError(f"The learner at {root} holds a symbolic link, {rel} (to {os.readlink(link)}); sbcli reads "
                           "and writes only inside a learner's own directory: replace the link with a copy of what "
                           "it points to, or restore the learner from a copy.")


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
        if rel.startswith(OBJECTS_DIR + "/") and rel != object_path(record["sha256"]):
            raise LearnerError(f"{where} is damaged: the block {rel} is recorded with another SHA-256 than its name; "
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


@dataclass(frozen=True)
class Stored:
    """What one reading of ``learner.json`` says.

    Attributes:
        root: the learner directory.
        version: its format version (1 or 2).
        state: the state fields (learner.json without the storage keys).
        kept: for every kept step, its files (key -> path relative to ``root``).
        keep: how many steps a save keeps (None: all).
        raw: the bytes of learner.json as read (a reader retries when they changed under it).
        hashes: path -> SHA-256 and size of every file a kept step names (empty before format 3).
        objects: per kept step, the SHA-256 of every block its files name (empty before format 4).
    """

    root: Path
    version: int
    state: dict[str, Any]
    kept: dict[int, dict[str, str]]
    keep: int | None
    raw: bytes
    hashes: dict[str, Record] = field(default_factory=dict)
    objects: dict[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def current(self) -> int:
        return len(self.state.get("history") or [])

    @property
    def files(self) -> dict[str, str]:
        return self.kept[self.current]

    def step_files(self, step: int | None) -> dict[str, str]:
        """The files of ``step`` (default: the current one). Raises LearnerError when it is not kept."""
        n = self.current if step is None else step
        if n not in self.kept:
            kept = ", ".join(str(k) for k in sorted(self.kept)) or "none"
            raise LearnerError(f"Step {n} of the learner at {self.root} is not kept (kept steps: {kept}); "
                               "choose one of those.")
        return self.kept[n]

    def step_state(self, step: int) -> tuple[Any, Path]:
        """The state JSON of kept ``step`` and the file it came from.

        For the current step that is ``learner.json``, which no hash covers: once its fields are checked,
        the reader calls :meth:`check_agrees`.
        """
        if step == self.current:
            return self.state, self.root / STATE_FILE
        rel = self.step_files(step).get("state")
        if rel is None:
            raise LearnerError(f"Step {step} of the learner at {self.root} has no recorded state; it cannot be gone back to.")
        where = self.root / rel
        return read_json_bytes(bytes(self.read(rel)), where), where

    def check_agrees(self) -> None:
        """``learner.json`` says what the current step's hashed ``state.json`` says, field by field.

        Raises:
            LearnerError: a field differs (an edit of learner.json: labels swapped, normalisation changed).
        """
        rel = self.files.get("state")
        if rel is None or rel not in self.hashes:  # a step without its own record, or from before the hashes
            return
        recorded = read_json_bytes(bytes(self.read(rel)), self.root / rel)
        if not isinstance(recorded, dict):
            raise LearnerError(f"{self.root / rel} holds no JSON object; {RESTORE}.")
        differs = sorted(k for k in set(self.state) | set(recorded) if k != "format_version"
                         and _canonical(self.state.get(k)) != _canonical(recorded.get(k)))
        if differs:
            raise LearnerError(f"{self.root / STATE_FILE} disagrees with the step's hashed record {rel} on "
                               f"{', '.join(differs[:3])}: it was edited after it was saved; {RESTORE}.")

    def checked_state(self, step: int | None) -> tuple[dict[str, Any], Path]:
        """The state JSON of kept ``step`` (default: the current one), its fields checked, and where it came from.

        For the current step, ``learner.json`` must also say what the step's hashed record says
        (:meth:`check_agrees`).

        Raises:
            LearnerError: the step is not kept, or its state is malformed or disagrees with its record.
        """
        n = self.current if step is None else step
        data, where = self.step_state(n)
        check_state_json(data, where)
        if n == self.current:
            self.check_agrees()
        if not isinstance(data, dict):
            raise LearnerError(f"{where} holds a JSON {type(data).__name__}, not an object; restore it from a copy.")
        return data, where

    def read(self, rel: str) -> bytearray:
        """The bytes of the named file ``rel``, checked against its recorded SHA-256 and size (when recorded)."""
        return read_verified(self.root / rel, self.hashes.get(rel))

    def read_file(self, rel: str) -> bytearray:
        """:meth:`read`, and FileNotFoundError for anything at ``rel`` that is not a file (a folder)."""
        if not (self.root / rel).is_file():
            raise FileNotFoundError(2, "No such file", str(self.root / rel))
        return self.read(rel)

    def referenced(self) -> set[str]:
        """Every path (relative to the root) that a kept step names: its files and its blocks."""
        return ({rel for files in self.kept.values() for rel in files.values()}
                | {object_path(sha) for blocks in self.objects.values() for sha in blocks})

    def step_blocks(self, step: int) -> tuple[str, ...]:
        """The SHA-256 of every block that kept ``step``'s files name."""
        return self.objects.get(step, ())


@dataclass(frozen=True)
class StepRead:
    """One kept step as a reader gets it: the checked state JSON and the verified bytes of the step's files.

    Attributes:
        root: the learner directory.
        state: the step's state fields, checked (:meth:`Stored.checked_state`).
        where: the file the state came from (``learner.json`` for the current step).
        files: key -> path relative to ``root`` (keys of :data:`STEP_FILES`).
        data: key -> the bytes of that file, checked against its recorded SHA-256 and size (the state excepted).
        blocks: SHA-256 -> the bytes of every block the step's files name, each checked against its name.
    """

    root: Path
    state: dict[str, Any]
    where: Path
    files: dict[str, str]
    data: dict[str, bytearray]
    blocks: dict[str, bytearray] = field(default_factory=dict)

    def path(self, key: str) -> Path:
        return self.root / self.files[key]

    def tensors(self, key: str) -> dict[str, Any]:
        """The tensors of the step file ``key``, those stored as blocks joined back (parsed without trust).

        Raises:
            LearnerError: a malformed file, or blocks that do not make its tensors.
        """
        return assemble(self.data[key], self.path(key), self.blocks.__getitem__)


def read_step(root: Path, step: int | None = None) -> StepRead:
    """Read ``learner.json`` once, check the state of ``step`` (default: the current one), then read every
    file it names, each checked against its hash as it is read.

    A writer may commit and delete the files this reading named while it reads them: the reader then
    reads ``learner.json`` again, once (when it changed), and reads the files that one names.

    Raises:
        LearnerError: no learner, a malformed or altered file, a step not kept, or a named file missing.
    """
    seen: bytes | None = None
    missing = FileNotFoundError(2, "No such file", str(root / STATE_FILE))
    for _attempt in range(2):
        stored = read_stored(root)
        if stored.raw == seen:  # nothing was committed meanwhile: the file is simply missing
            break
        seen = stored.raw
        files = stored.step_files(step)
        try:
            state, where = stored.checked_state(step)  # a kept step's state.json is a named file too
            data = {key: stored.read_file(rel) for key, rel in files.items() if key != "state"}
            blocks = _read_blocks(stored, step, files, data)
        except FileNotFoundError as err:
            missing = err
            continue
        return StepRead(root, state, where, files, data, blocks)
    name = Path(missing.filename or "a file")
    rel = name.relative_to(root) if name.is_relative_to(root) else name
    raise LearnerError(f"The learner at {root} is missing {rel}; restore the directory from a copy.") from missing


def _read_blocks(stored: Stored, step: int | None, files: dict[str, str],
                 data: dict[str, bytearray]) -> dict[str, bytearray]:
    """The blocks the step's (verified) files name, each read once and checked against its name.

    Raises:
        LearnerError: a file names a block that ``learner.json`` does not list for the step.
        FileNotFoundError: a block is not there (a concurrent save may have dropped the step).
    """
    listed = set(stored.step_blocks(stored.current if step is None else step))
    blocks: dict[str, bytearray] = {}
    for key, raw in data.items():
        for name, ref in refs(raw, stored.root / files[key]).items():
            for sha in ref.parts:
                if sha not in listed:
                    raise LearnerError(f"{stored.root / files[key]} names a block of {name!r} ({sha[:12]}...) that "
                                       f"learner.json does not list for its step; {RESTORE}.")
                if sha not in blocks:  # listed, hence recorded in hashes (read_stored checks both)
                    rel = object_path(sha)
                    blocks[sha] = read_verified(stored.root / rel, stored.hashes[rel])
    return blocks


def _canonical(value: Any) -> str:
    """One text for equal JSON values: NaN equals NaN here, as it does not in Python, and equals the null a
    strict writer puts in its place (an older learner's kept step holds NaN where a newer learner.json has null)."""
    return json.dumps(strict(value), sort_keys=True, allow_nan=False)


def read_json_bytes(raw: bytes, where: Path) -> Any:
    """``sbcli.learner.validate.read_json`` on bytes already read (a reader keeps them to notice a commit)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise LearnerError(f"{where} is damaged: it is not UTF-8 text (byte {err.start}); {RESTORE}.") from err
    except (ValueError, RecursionError) as err:  # JSONDecodeError, too many digits, nesting too deep
        raise LearnerError(f"{where} is damaged: it is not valid JSON ({str(err).splitlines()[0][:120]}); "
                           f"{RESTORE}.") from err


def read_stored(root: Path) -> Stored:
    """Read ``root/learner.json`` once. Raises LearnerError when there is no learner or it is malformed."""
    path = root / STATE_FILE
    if not root.is_dir() or not path.is_file():
        raise LearnerError(f"No learner at {root}; give the directory that `sb train --out` wrote.")
    check_confined(root)
    raw = path.read_bytes()
    data = read_json_bytes(raw, path)
    version = check_format_version(data, path)
    if version > FORMAT_VERSION:
        raise LearnerError(f"The learner at {root} has format version {version}, newer than this sbcli reads "
                           f"({FORMAT_VERSION}); upgrade sbcli.")
    state = {k: v for k, v in data.items() if k not in STORAGE_KEYS}
    history = state.get("history")
    if not isinstance(history, list):
        raise LearnerError(f"{path} has no history list; restore it from a copy.")
    if version == 1:
        return Stored(root, 1, state, {len(history): dict(V1_FILES)}, None, raw)
    kept = _kept(data, len(history), path)
    objects = _objects(data.get(OBJECTS_KEY), set(kept), path) if version >= OBJECTS_SINCE else {}
    referenced = ({rel for files in kept.values() for rel in files.values()}
                  | {object_path(sha) for blocks in objects.values() for sha in blocks})
    hashes = parse_hashes(data.get(HASHES_KEY), referenced, path, required=version >= HASHED_SINCE)
    return Stored(root, version, state, kept, _keep(data.get("keep"), path), raw, hashes, objects)


def _objects(value: Any, kept: set[int], where: Path) -> dict[int, tuple[str, ...]]:
    """``learner.json``'s ``objects``: kept step -> the SHA-256 of its blocks (a step with none may be absent)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and k.isdigit() and int(k) in kept and isinstance(v, list)
            and all(isinstance(s, str) and HEX64.fullmatch(s) for s in v) for k, v in value.items()):
        raise LearnerError(f"{where} is damaged: objects must map kept steps to lists of SHA-256 names; {RESTORE}.")
    return {int(k): tuple(v) for k, v in value.items()}


def _kept(data: dict[str, Any], current: int, where: Path) -> dict[int, dict[str, str]]:
    files, kept_json = data.get("files"), data.get("kept_steps")
    if not isinstance(kept_json, dict) or not all(isinstance(k, str) and k.isdigit() for k in kept_json):
        raise LearnerError(f"{where} has no valid kept_steps (an object from step numbers to files); restore it from a copy.")
    kept = {int(k): _step_map(v, where) for k, v in kept_json.items()}
    if kept.get(current) != _step_map(files, where):
        raise LearnerError(f"{where}: files does not name the files of the current step {current}; restore it from a copy.")
    return kept


def _step_map(value: Any, where: Path) -> dict[str, str]:
    if not isinstance(value, dict):
        raise LearnerError(f"{where} names a step's files with a {type(value).__name__}, not an object; restore it from a copy.")
    known = {key: required for key, _, required in STEP_FILES}
    missing = [k for k, required in known.items() if required and k not in value]
    if missing:
        raise LearnerError(f"{where} names no {', '.join(missing)} file for a step; restore it from a copy.")
    out: dict[str, str] = {}
    for key, rel in value.items():
        if key not in known or not isinstance(rel, str) or not is_step_path(rel):
            raise LearnerError(f"{where} names {key!r}: {rel!r}, not a file under {STEPS_DIR}/; restore it from a copy.")
        out[key] = rel
    return out


def _keep(value: Any, where: Path) -> int | None:
    if value is None or (type(value) is int and value >= 1):
        return value
    raise LearnerError(f"{where} has keep {value!r}, not a positive integer or null; restore it from a copy.")


def is_step_path(rel: str) -> bool:
    """``steps/<step folder>/<file>`` or ``<file>`` at the root: no absolute path, no '..'."""
    parts = PurePosixPath(rel).parts
    names = {name for _, name, _ in STEP_FILES}
    if "\\" in rel or not parts or parts[-1] not in names:
        return False
    return len(parts) == 1 or (len(parts) == 3 and parts[0] == STEPS_DIR and bool(STEP_DIR.fullmatch(parts[1])))


def holds_learner(folder: Path) -> bool:
    return (folder / STATE_FILE).is_file()
