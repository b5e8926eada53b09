"""Outputs never clobber inputs: the checks of ``-o``/``--out`` before any work starts."""

from __future__ import annotations

from pathlib import Path

from sbcli.errors import ConfigError, LearnerError
from sbcli.learner.store.commit import only_leftovers
from sbcli.learner.store.layout import check_confined, holds_learner


def enclosing_learner(path: Path) -> Path | None:
    """The learner directory that ``path`` is inside of (or is), if any."""
    resolved = path.resolve()
    for folder in (resolved, *resolved.parents):
        if holds_learner(folder):
            return folder
    return None


def check_output_file(out: Path, *, overwrite: bool = False, option: str = "-o") -> None:
    """A file to write (``sb export -o``): never a directory, never inside a learner, never an
    existing file unless ``overwrite``.

    Raises:
        ConfigError: one sentence naming the fix.
    """
    if out.is_dir():
        raise ConfigError(f"{option} {out} is a directory; give a file name such as {out / 'model.onnx'}.")
    learner = enclosing_learner(out.parent)
    if learner is not None:
        raise ConfigError(f"{option} {out} is inside the learner at {learner}; write the file outside the learner directory.")
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} already exists; pass --overwrite to replace it or choose another {option}.")


def check_output_dir(out: Path, *, option: str = "-o", resume: bool = False) -> None:
    """A learner directory to create (``sb train --out``, ``sb pull -o``): not a file, not inside
    another learner, empty (or holding only what an interrupted first save left) unless ``resume``.

    Raises:
        LearnerError: one sentence naming the fix.
    """
    if out.exists() and not out.is_dir():
        raise LearnerError(f"{option} {out} is a file, not a directory; choose a new directory.")
    learner = enclosing_learner(out.parent)
    if learner is not None:
        raise LearnerError(f"{option} {out} is inside the learner at {learner}; choose a directory outside it.")
    if out.is_dir():
        check_confined(out)
    if resume:
        return
    if holds_learner(out):
        raise LearnerError(f"{out} already holds a learner; choose another {option}"
                          + (", or pass --resume to continue it." if option == "--out" else ", or remove it first."))
    if out.is_dir() and not only_leftovers(out):
        raise LearnerError(f"{out} already exists and is not empty; choose another {option}.")
