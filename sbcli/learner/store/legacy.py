"""Learners left behind by the save of sbcli 0.1.

That save wrote a complete new directory ``.L.tmp-*`` beside ``L``, renamed ``L`` to ``.L.old-<pid>``,
renamed the new one to ``L`` and deleted the old one. A kill between the two renames left no
learner at ``L``, only the two hidden folders. The next command that opens ``L`` puts the newest
complete one back in its place (one atomic rename) and says so; a writer then removes the rest
(:func:`recover` with ``writer``, as it opens the learner), but only folders that hold nothing but a save's
files: a folder of the user's own that happens to have such a name (``.L.old-backup`` full of photos)
is left alone and named.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from sbcli.errors import LearnerError
from sbcli.learner.store.commit import written_by_a_save
from sbcli.learner.store.layout import holds_learner, read_stored

LOG = logging.getLogger(__name__)


def leftovers(target: Path) -> list[Path]:
    """``.L.tmp-*`` (newer) then ``.L.old-*`` (older) beside ``target``, each newest first."""
    parent = target.parent
    if not parent.is_dir():
        return []
    found = []
    for kind in ("tmp", "old"):
        found += sorted(parent.glob(f".{target.name}.{kind}-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    return [p for p in found if p.is_dir() and not p.is_symlink()]  # a link is never moved into place nor deleted through


def _complete(folder: Path) -> bool:
    try:
        stored = read_stored(folder)
    except LearnerError:
        return False
    return all((folder / rel).is_file() for rel in stored.files.values())


def recover(target: Path, *, writer: bool = False) -> Path | None:
    """When ``target`` holds no learner but an interrupted 0.1 save left one beside it, move the newest
    complete one back; a ``writer`` also removes the other leftovers, once ``target`` holds a learner (only
    what a save provably wrote: :func:`sbcli.learner.store.commit.written_by_a_save`).

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
        for candidate in (c for c in found if c != moved):
            if not written_by_a_save(candidate):
                LOG.warning("Left %s beside %s alone: it has the name of an interrupted save's folder but holds "
                            "files no save writes; move or rename it if it is yours.", candidate, target.name)
                continue
            try:
                shutil.rmtree(candidate)
            except FileNotFoundError:  # a writer that opened the learner at the same moment removed it first
                continue
            LOG.info("Removed %s, left beside %s by an interrupted save.", candidate.name, target.name)
    return moved


def _vacant(target: Path) -> bool:
    """No learner can be put back at ``target`` but where nothing is: no entry, or an empty folder."""
    return not target.exists() or (target.is_dir() and not any(target.iterdir()))
