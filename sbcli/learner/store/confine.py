"""A learner is confined to its own directory: no symbolic link inside it is followed.

A ``steps/`` folder, a step folder or a file that is a symbolic link could make a reader read
another learner's files, and a writer (which deletes the step folders ``learner.json`` no longer
names) delete folders elsewhere. So every command refuses a learner holding a link, in one sentence,
before it reads or writes anything there: :func:`check_confined` looks (``lstat``, never following a
link) at the entries of the learner's root and everything below ``steps/``. The learner's path
itself may be a link; it is resolved once, and nothing is written outside that resolved directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from sbcli.errors import LearnerError

STEPS_DIR = "steps"


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
                inside_steps = folder != root or entry.name == STEPS_DIR
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
