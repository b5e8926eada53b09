"""Learners left behind by the save of sbcli 0.1.

That save wrote a complete new directory ``.L.tmp-*`` beside ``L``, renamed ``L`` to ``.L.old-<pid>``,
renamed the new one to ``L`` and deleted the old one. A kill between the two renames left no
learner at ``L``, only the two hidden folders. The next command that opens ``L`` puts the newest
complete one back in its place (one atomic rename) and says so; a writer then removes the rest
(:func:`sbcli.learner.store.commit.remove_siblings`), but only folders that hold nothing but a save's
files: a folder of the user's own that happens to have such a name (``.L.old-backup`` full of photos)
is left alone and named.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sbcli.errors import LearnerError
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


def recover(target: Path) -> Path | None:
    """When ``target`` holds no learner but an interrupted 0.1 save left one beside it, move it back.

    Returns the folder that was moved into place (None when there was nothing to do).
    """
    if holds_learner(target) or (target.exists() and (not target.is_dir() or any(target.iterdir()))):
        return None
    for candidate in leftovers(target):
        if not _complete(candidate):
            continue
        if target.exists():
            target.rmdir()
        try:
            os.replace(candidate, target)
        except OSError as err:
            raise LearnerError(f"No learner at {target}, but an interrupted save left a complete one in {candidate}; "
                               f"move it back with: mv '{candidate}' '{target}' ({err.strerror}).") from err
        LOG.warning("Recovered the learner at %s from %s, left by an interrupted save.", target, candidate.name)
        return candidate
    return None
