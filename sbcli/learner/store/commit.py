"""The one atomic commit point of a learner: ``os.replace`` of ``learner.json``; and what a writer may delete.

A save writes the new step's files under a new folder ``steps/NNNN/``, fsyncs each file, the folder,
``steps/`` and the root, writes ``learner.json.tmp-<pid>``, fsyncs it, renames it onto
``learner.json`` (THE commit) and fsyncs the root; only then are the step folders that no kept step
names any more deleted. At every instant the path holds a complete learner, old or new: a crash
before the rename leaves the old ``learner.json`` naming the old (untouched, immutable) files, a
crash after it leaves the new one naming files already on disk. What a crash leaves behind
(unreferenced step folders, ``learner.json.tmp-*``) is removed by the next writer, under the lock;
readers ignore it.

The caller holds the writer lock (:func:`sbcli.learner.store.lock.writer_lock`). A writer deletes only
what a save provably wrote (:func:`is_step_folder`, :func:`only_leftovers`):
a folder of the user's own that happens to have such a name is left alone and named; and never
through a symbolic link (every deleting function runs right after the learner was checked for links).
The hash of every file a step names is computed here, from the bytes written (:func:`digest_bytes`).

Tests drive a crash at every named point of a save through :func:`checkpoint`: with the environment
variable ``SBCLI_FAULT_AT=<point>`` the process ends there at once (``os._exit``), as a SIGKILL would.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sbcli.errors import CommittedInterrupt, LearnerError
from sbcli.jsonutil import strict
from sbcli.learner.store.layout import (
    CHUNK,
    FORMAT_VERSION,
    HASHES_KEY,
    HEX64,
    LOCK_FILE,
    LOCK_INFO,
    OBJECTS_KEY,
    STATE_FILE,
    STEP_DIR,
    STEP_FILES,
    STEPS_DIR,
    TMP_PREFIX,
    V1_FILES,
    Record,
    Stored,
    check_confined,
    read_stored,
)
from sbcli.learner.store.objects import OBJECTS_DIR, object_path

LOG = logging.getLogger(__name__)
FAULT_ENV = "SBCLI_FAULT_AT"
FAULT_EXIT = 86


def checkpoint(point: str) -> None:
    """A named point of a save; tests end the process here (``SBCLI_FAULT_AT``) or patch this function."""
    if os.environ.get(FAULT_ENV) == point:
        os._exit(FAULT_EXIT)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (created, renamed, deleted names) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes, point: str) -> None:
    """Write a new file (mode from the umask), then fsync it; never overwrites an existing file."""
    with open(path, "xb") as f:
        f.write(data)
    checkpoint(f"write:{point}")
    fsync_file(path)
    checkpoint(f"fsync:{point}")


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


def records_for(root: Path, referenced: set[str], known: dict[str, Record]) -> dict[str, Record]:
    """A record for every path in ``referenced``: ``known`` ones kept, the others hashed from disk once."""
    return {rel: known[rel] if rel in known else digest_file(root / rel) for rel in sorted(referenced)}


def state_bytes(state: dict[str, Any]) -> bytes:
    """Strict JSON (any parser reads it): a number without a value (NaN, an infinity) is written as null
    (:func:`sbcli.jsonutil.strict`), which readers take back as NaN where a metric is expected."""
    return (json.dumps(strict(state), indent=2, allow_nan=False) + "\n").encode("utf-8")


def commit_step(root: Path, payload: dict[str, bytes], state: dict[str, Any], keep: int | None = None,
                blocks: dict[str, bytes] | None = None) -> None:
    """Write one step (``payload``: per-step key -> file bytes, without ``state``) and commit it.

    ``blocks`` are the content-addressed blocks the step's files name (SHA-256 -> bytes,
    :mod:`sbcli.learner.store.objects`); only those not already stored are written. ``state`` is the
    learner's state (its ``history`` gives the step number). ``keep`` limits the kept steps to the last
    N (None: the learner's stored setting, all for a new learner). Kept steps after this one (left by a
    rollback) are dropped.

    Raises:
        LearnerError: the directory cannot be written (one sentence; the old learner stays as it was).
    """
    state = {**state, "format_version": FORMAT_VERSION}
    step = len(state["history"])
    blocks = blocks or {}
    try:
        root.mkdir(parents=True, exist_ok=True)
        check_confined(root)  # also where no learner.json is yet: leftovers are deleted below
        old = read_stored(root) if (root / STATE_FILE).is_file() else None
        remove_leftovers(root, old)
        kept = {} if old is None else {n: f for n, f in _kept_after_migration(root, old).items() if n < step}
        objects = {} if old is None else {n: b for n, b in old.objects.items() if n in kept}
        write_blocks(root, blocks)
        step_payload = {**payload, "state": state_bytes(state)}
        kept[step] = write_step(root, step, step_payload)
        objects[step] = tuple(sorted(blocks))
        known = {rel: digest_bytes(step_payload[key]) for key, rel in kept[step].items()}
        known.update({object_path(sha): {"sha256": sha, "size": len(data)} for sha, data in blocks.items()})
        keep = keep if keep is not None else (old.keep if old is not None else None)
        if keep is not None:
            kept = {n: f for n, f in kept.items() if n > step - keep}
            objects = {n: b for n, b in objects.items() if n in kept}
        referenced = _referenced(kept, objects)
        hashes = records_for(root, referenced, {**(old.hashes if old else {}), **known})
        switch(root, {**state, "files": kept[step], "kept_steps": _kept_json(kept), "keep": keep,
                      HASHES_KEY: hashes, OBJECTS_KEY: _objects_json(objects)})
    except OSError as err:
        raise LearnerError(f"Could not save the learner at {root} ({err.strerror or err}: {err.filename or root}); "
                           "the learner there is unchanged; free space or fix the permissions and run again.") from err
    with after_commit(root, step):
        remove_unreferenced(root, referenced)


def write_blocks(root: Path, blocks: dict[str, bytes]) -> None:
    """Write the blocks not yet stored under ``objects/``, each fsynced, then the folder.

    A block already there is one the committed ``learner.json`` names (the save removed every other
    one first, :func:`remove_leftovers`), so it was written and synced before that commit.
    """
    if not blocks:
        return
    folder = root / OBJECTS_DIR
    new_folder = not folder.is_dir()
    folder.mkdir(exist_ok=True)
    wrote = False
    for sha in sorted(blocks):
        if not (folder / sha).exists():
            write_durable(folder / sha, blocks[sha], "object")
            wrote = True
    if wrote or new_folder:
        fsync_dir(folder)
        checkpoint("fsync:objects")
    if new_folder:
        fsync_dir(root)


def write_flat(folder: Path, payload: dict[str, bytes], state: dict[str, Any],
               blocks: dict[str, bytes] | None = None) -> None:
    """A one-step learner with its files at the root of a new folder (what a push uploads), its blocks under
    ``objects/``."""
    folder.mkdir(parents=True)
    blocks = blocks or {}
    files, hashes = {}, {}
    state = {**state, "format_version": FORMAT_VERSION}
    payload = {**payload, "state": state_bytes(state)}  # hashed: learner.json must agree with it (Stored.check_agrees)
    write_blocks(folder, blocks)
    hashes.update({object_path(sha): {"sha256": sha, "size": len(data)} for sha, data in blocks.items()})
    for key, name, _required in STEP_FILES:
        if key in payload:
            write_durable(folder / name, payload[key], key)
            files[key], hashes[name] = name, digest_bytes(payload[key])
    step = len(state["history"])
    write_durable(folder / STATE_FILE, state_bytes({**state, "files": files,
                                                    "kept_steps": {str(step): files}, "keep": None,
                                                    HASHES_KEY: dict(sorted(hashes.items())),
                                                    OBJECTS_KEY: _objects_json({step: tuple(sorted(blocks))})}),
                  STATE_FILE)


def commit_pointer(root: Path, stored: Stored, step: int) -> None:
    """Make kept step ``step`` current again (a rollback): one new ``learner.json``, no file deleted."""
    files = stored.step_files(step)
    state, _ = stored.step_state(step)
    try:
        check_confined(root)  # nothing is deleted through a link, and the learner was read a while ago
        remove_leftovers(root, stored)
        hashes = records_for(root, _referenced(stored.kept, stored.objects), stored.hashes)
        switch(root, {**state, "format_version": FORMAT_VERSION, "files": files,
                      "kept_steps": _kept_json(stored.kept), "keep": stored.keep, HASHES_KEY: hashes,
                      OBJECTS_KEY: _objects_json(stored.objects)})
    except OSError as err:
        raise LearnerError(f"Could not write {root / STATE_FILE} ({err.strerror or err}); the learner is unchanged.") from err


def _referenced(kept: dict[int, dict[str, str]], objects: dict[int, tuple[str, ...]]) -> set[str]:
    """Every path the kept steps name: their files and their blocks."""
    return ({rel for files in kept.values() for rel in files.values()}
            | {object_path(sha) for n, blocks in objects.items() if n in kept for sha in blocks})


def _objects_json(objects: dict[int, tuple[str, ...]]) -> dict[str, list[str]]:
    return {str(n): list(objects[n]) for n in sorted(objects) if objects[n]}


def _kept_json(kept: dict[int, dict[str, str]]) -> dict[str, dict[str, str]]:
    return {str(n): kept[n] for n in sorted(kept)}


def _kept_after_migration(root: Path, old: Stored) -> dict[int, dict[str, str]]:
    """Format 1: copy its one step into ``steps/`` (its root files go after the commit)."""
    if old.version != 1:
        return dict(old.kept)
    payload = {key: (root / name).read_bytes() for key, name in V1_FILES.items()}
    payload["state"] = state_bytes({**old.state, "format_version": FORMAT_VERSION})
    return {old.current: write_step(root, old.current, payload)}


def write_step(root: Path, step: int, payload: dict[str, bytes]) -> dict[str, str]:
    """Write a step's files in a new folder under ``steps/``; returns key -> path relative to ``root``."""
    steps = root / STEPS_DIR
    new_steps_dir = not steps.is_dir()
    steps.mkdir(exist_ok=True)
    folder = _free_folder(steps, step)
    folder.mkdir()
    checkpoint("mkdir:step")
    files: dict[str, str] = {}
    for key, name, _required in STEP_FILES:
        if key in payload:
            write_durable(folder / name, payload[key], key)
            files[key] = f"{STEPS_DIR}/{folder.name}/{name}"
    fsync_dir(folder)
    checkpoint("fsync:step-dir")
    fsync_dir(steps)
    checkpoint("fsync:steps")
    if new_steps_dir:
        fsync_dir(root)
    return files


def _free_folder(steps: Path, step: int) -> Path:
    """``NNNN``, or ``NNNN-k`` when a kept later step (left by a rollback) still holds that name."""
    name, k = f"{step:04d}", 0
    while (steps / name).exists():
        k += 1
        name = f"{step:04d}-{k}"
    return steps / name


def switch(root: Path, document: dict[str, Any]) -> None:
    """THE commit: a fsynced temporary renamed onto learner.json, then the directory fsynced."""
    tmp = root / f"{TMP_PREFIX}{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # our own pid's leftover: a previous process with this pid crashed here
    try:
        write_durable(tmp, state_bytes(document), STATE_FILE + ".tmp")
        os.replace(tmp, root / STATE_FILE)
    except Exception:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with after_commit(root, len(document["history"])):
        checkpoint("rename:" + STATE_FILE)
        fsync_dir(root)
        checkpoint("fsync:root")


@contextlib.contextmanager
def after_commit(root: Path, step: int) -> Iterator[None]:
    """A Ctrl-C in the block (after the commit) says that the step is committed, not merely "interrupted"."""
    try:
        yield
    except CommittedInterrupt:
        raise
    except KeyboardInterrupt as err:
        raise CommittedInterrupt(root, step) from err


def remove_leftovers(root: Path, stored: Stored | None) -> None:
    """Delete what an interrupted save left: unreferenced step folders and ``learner.json.tmp-*``."""
    for tmp in root.glob(TMP_PREFIX + "*"):
        tmp.unlink()
        checkpoint("delete:tmp")
    referenced = set() if stored is None else stored.referenced()
    _remove_steps(root, referenced, "delete:leftover-step")
    _remove_blocks(root, referenced, "delete:leftover-object")


def remove_unreferenced(root: Path, referenced: set[str]) -> None:
    """After a commit: the step folders and format-1 files that the new ``learner.json`` no longer names
    (``referenced``: what it names). The save checked the learner for links before it wrote, under the
    writer lock, so nothing is deleted through one.

    A failure here loses nothing (the commit is done); the next writer retries.
    """
    try:
        _remove_steps(root, referenced, "delete:dropped-step")
        _remove_blocks(root, referenced, "delete:dropped-object")
        for name in V1_FILES.values():
            if (root / name).exists() and name not in referenced:
                (root / name).unlink()
                checkpoint("delete:v1")
        fsync_dir(root)
    except OSError as err:
        LOG.warning("The learner at %s is saved; removing its unused step files failed (%s), the next save retries.",
                    root, err)


def _remove_steps(root: Path, referenced: set[str], point: str) -> None:
    """Delete the step folders under ``steps/`` that no path in ``referenced`` names and a save wrote.

    The caller has just checked the learner for links (:func:`sbcli.learner.store.layout.check_confined`,
    which ``read_stored`` runs): a ``steps/`` link could lead to the user's own folders.
    """
    steps = root / STEPS_DIR
    if not steps.is_dir():
        return
    used = {rel.split("/")[1] for rel in referenced if rel.startswith(STEPS_DIR + "/")}
    for folder in sorted(steps.iterdir()):
        if folder.name in used or not (STEP_DIR.fullmatch(folder.name) or folder.name.startswith(".")):
            continue
        if not is_step_folder(folder):  # not what a save wrote (a user's own folder): never deleted
            LOG.warning("Left %s alone: it is not a step folder that sbcli wrote.", folder)
            continue
        shutil.rmtree(folder)
        checkpoint(point)
    fsync_dir(steps)


def _remove_blocks(root: Path, referenced: set[str], point: str) -> None:
    """Delete the blocks under ``objects/`` that no path in ``referenced`` names (``--keep``, a dropped step,
    an interrupted save's). Anything there not named like a block is left alone and named."""
    folder = root / OBJECTS_DIR
    if not folder.is_dir() or folder.is_symlink():
        return
    removed = False
    for entry in sorted(folder.iterdir()):
        if object_path(entry.name) in referenced:
            continue
        if not (HEX64.fullmatch(entry.name) and _plain_file(entry)):
            LOG.warning("Left %s alone: it is not a block that sbcli wrote.", entry)
            continue
        entry.unlink()
        removed = True
        checkpoint(point)
    if removed:
        fsync_dir(folder)


def _plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def is_step_folder(folder: Path) -> bool:
    """A folder that a save wrote under ``steps/``: a real directory of nothing but step files.

    Only such a folder is ever deleted as a leftover: a folder of the user's own that happens to have
    a step's name (``steps/2023/``) holds other files, and is left alone.
    """
    names = {name for _, name, _ in STEP_FILES}
    return folder.is_dir() and not folder.is_symlink() and all(
        p.name in names and _plain_file(p) for p in folder.iterdir())


def is_steps_tree(steps: Path) -> bool:
    """``steps/`` as saves write it: step-named folders (or a save's hidden ones) that are step folders."""
    return steps.is_dir() and not steps.is_symlink() and all(
        (STEP_DIR.fullmatch(p.name) or p.name.startswith(".")) and is_step_folder(p) for p in steps.iterdir())


def is_objects_tree(folder: Path) -> bool:
    """``objects/`` as saves write it: a real directory of blocks (plain files named by a SHA-256)."""
    return folder.is_dir() and not folder.is_symlink() and all(
        HEX64.fullmatch(p.name) and _plain_file(p) for p in folder.iterdir())


def only_leftovers(folder: Path) -> bool:
    """True when ``folder`` holds nothing but what an interrupted first save leaves (no learner.json):
    the lock, ``learner.json.tmp-*`` files, a ``steps/`` tree of step folders and an ``objects/`` folder of
    blocks, nothing of anyone else's."""
    for entry in folder.iterdir():
        if entry.name == STEPS_DIR:
            if not is_steps_tree(entry):
                return False
        elif entry.name == OBJECTS_DIR:
            if not is_objects_tree(entry):
                return False
        elif not (_store_file(entry.name) and _plain_file(entry)):
            return False
    return True


def _store_file(name: str) -> bool:
    """The lock, its note (and the note's temporary while it is replaced), a temporary learner.json."""
    return name == LOCK_FILE or name.startswith((LOCK_INFO, TMP_PREFIX))
