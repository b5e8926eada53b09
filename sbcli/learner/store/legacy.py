"""Learners left behind by the save of sbcli 0.1.

That save wrote a complete new directory ``.L.tmp-XXXXXXXX`` beside ``L`` (``tempfile.mkdtemp``: eight
characters of ``a-z0-9_``), renamed ``L`` to ``.L.old-<pid>`` (the saving process's id), renamed the
new one to ``L`` and deleted the old one. A kill between the two renames left no learner at ``L``,
only the two hidden folders. The next command that opens ``L`` puts the newest complete one back in
its place (one atomic rename) and says so; a writer then removes the rest (:func:`recover` with
``writer``, as it opens the learner).

Such a folder is told by name AND by what it holds, never by name alone (:func:`left_by_0_1`): the
exact name that save wrote (``.L.old-`` and a process id, ``.L.tmp-`` and mkdtemp's eight characters),
and nothing in it but a format-1 learner's files (the only format 0.1 wrote). A folder of the user's
own with a similar name (``.L.old-copy``, ``.L.old-backup`` full of photos, a copy of a newer learner
as ``.L.old-1234``) is never moved nor deleted; a writer names it and leaves it alone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from sbcli.errors import LearnerError
from sbcli.learner.store.layout import STATE_FILE, V1_FILES, holds_learner

LOG = logging.getLogger(__name__)

# What 0.1 named them: a process id (Linux's largest is 2**22), and tempfile.mkdtemp's random part.
OLD_SUFFIX = re.compile(r"old-[1-9][0-9]{0,6}")
TMP_SUFFIX = re.compile(r"tmp-[a-z0-9_]{8}")
MAX_STATE_BYTES = 64 << 20
V1_NAMES = frozenset({STATE_FILE, *V1_FILES.values()})  # all a 0.1 save wrote in either folder


def leftovers(target: Path) -> list[Path]:
    """The folders beside ``target`` that an interrupted 0.1 save left (:func:`left_by_0_1`):
    ``.L.tmp-*`` (newer) then ``.L.old-*`` (older), each newest first."""
    parent = target.parent
    if not parent.is_dir():
        return []
    found = []
    for kind in ("tmp", "old"):
        found += sorted(parent.glob(f".{target.name}.{kind}-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    return [p for p in found if left_by_0_1(p, target)]


def similar(target: Path) -> list[Path]:
    """Entries beside ``target`` with a 0.1 leftover's name prefix that are not one (the user's own)."""
    parent = target.parent
    if not parent.is_dir():
        return []
    return [p for kind in ("tmp", "old") for p in sorted(parent.glob(f".{target.name}.{kind}-*"))
            if not left_by_0_1(p, target)]


def named_by_0_1(folder: Path, target: Path) -> bool:
    """``folder``'s name is one a 0.1 save of ``target`` could have given it, exactly."""
    prefix = f".{target.name}."
    return folder.name.startswith(prefix) and bool(
        OLD_SUFFIX.fullmatch(folder.name[len(prefix):]) or TMP_SUFFIX.fullmatch(folder.name[len(prefix):]))


def left_by_0_1(folder: Path, target: Path) -> bool:
    """``folder`` has the exact name a 0.1 save of ``target`` gave (:func:`named_by_0_1`) and holds
    nothing but what that save wrote: a real directory of plain files among ``learner.json``,
    ``model.safetensors``, ``memory.safetensors``, its ``learner.json`` (when there is one) of format 1.

    A ``.L.old-<pid>`` is a whole learner (the one being replaced); a ``.L.tmp-*`` may be cut short.
    """
    if not named_by_0_1(folder, target) or folder.is_symlink() or not folder.is_dir():
        return False  # a link is never moved into place nor deleted through
    try:
        entries = list(folder.iterdir())
    except OSError:
        return False
    if not all(e.name in V1_NAMES and e.is_file() and not e.is_symlink() for e in entries):
        return False
    names = {e.name for e in entries}
    if folder.name[len(target.name) + 2:].startswith("old-") and names != V1_NAMES:
        return False
    return STATE_FILE not in names or _format(folder / STATE_FILE) == 1


def _format(path: Path) -> object:
    try:
        if path.stat().st_size > MAX_STATE_BYTES:  # no learner.json of 0.1 was that large: not one
            return None
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data.get("format_version") if isinstance(data, dict) else None


def _complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in V1_NAMES)


def recoverable(target: Path) -> Path | None:
    """The folder :func:`recover` would move back to ``target`` (where ``target`` holds nothing: the newest
    complete one an interrupted 0.1 save left beside it), found without moving anything: what a check made
    before the writer's lock reads."""
    if holds_learner(target) or not _vacant(target):
        return None
    return next((c for c in leftovers(target) if _complete(c)), None)


def recover(target: Path, *, writer: bool = False) -> Path | None:
    """When ``target`` holds no learner but an interrupted 0.1 save left one beside it, move the newest
    complete one back; a ``writer`` also removes the other leftovers, once ``target`` holds a learner
    (only what that save provably wrote: :func:`left_by_0_1`), and names the folders it leaves alone.

    Returns the folder that was moved into place (None when there was nothing to do).
    """
    vacant = not holds_learner(target) and _vacant(target)
    found = leftovers(target) if vacant or writer else []  # newest first
    moved = next((c for c in found if _complete(c)), None) if vacant else None
    if moved is not None:
        if target.exists():
            target.rmdir()
        try:
            os.replace(moved, target)
        except OSError as err:
            raise LearnerError(f"No learner at {target}, but an interrupted save left a complete one in {moved}; "
                               f"move it back with: mv '{moved}' '{target}' ({err.strerror}).") from err
        LOG.warning("Recovered the learner at %s from %s, left by an interrupted save.", target, moved.name)
    if writer and holds_learner(target):
        _remove(target, [c for c in found if c != moved])
    return moved


def _remove(target: Path, found: list[Path]) -> None:
    for candidate in found:
        try:
            shutil.rmtree(candidate)
        except FileNotFoundError:  # a writer that opened the learner at the same moment removed it first
            continue
        LOG.info("Removed %s, left beside %s by an interrupted save.", candidate.name, target.name)
    for other in similar(target):
        LOG.warning("Left %s beside %s alone: it has a name like an interrupted save's folder but is not one "
                    "that sbcli wrote; move or rename it if it is yours.", other, target.name)


def _vacant(target: Path) -> bool:
    """No learner can be put back at ``target`` but where nothing is: no entry, or an empty folder."""
    return not target.exists() or (target.is_dir() and not any(target.iterdir()))
