"""Walking a data folder that may hold symlinks: links are followed, loops and dangling links refused.

A class-per-folder tree is walked as torchvision's ImageFolder walks it (symlinks followed), but a
link back to a folder above it (a loop, which would list the same images forever) and a link
whose target is gone are each refused with one sentence naming the path, instead of a traceback
or a silently endless or partial listing.
"""

from __future__ import annotations

import errno
import os
import stat as stat_module
from collections.abc import Iterator
from pathlib import Path

from sbcli.errors import DataError

SHOWN_PATH = 160  # characters of a too-long path a message shows


def stat(path: Path) -> os.stat_result:
    """``path.stat()`` (following links), with a dangling or looping link said in one sentence.

    Raises:
        DataError: the path is a dangling symlink, a symlink loop, or cannot be read.
    """
    try:
        return path.stat()
    except OSError as err:
        raise DataError(_unreadable(path, err)) from err


def _unreadable(path: Path, err: OSError) -> str:
    if err.errno == errno.ENAMETOOLONG:  # before is_symlink, which fails on such a path too
        shown = str(path) if len(str(path)) <= SHOWN_PATH else str(path)[:SHOWN_PATH] + "..."
        return (f"The path {shown} ({len(str(path)):,} characters) is longer than the system allows; "
                "move the images to a folder nested less deep.")
    if path.is_symlink():
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        if not os.path.lexists(path) or isinstance(err, FileNotFoundError):
            return f"{path} is a symlink to {target}, which does not exist; remove the link or restore its target."
        return f"{path} is a symlink that cannot be followed ({err.strerror}); remove or fix the link."
    return f"Could not read {path} ({err.strerror or err}); check its permissions."


def walk_files(folder: Path) -> Iterator[Path]:
    """Every file below ``folder`` in sorted order, following symlinks.

    Raises:
        DataError: a symlink loops back to a folder above it, a link dangles, or a folder cannot be read.
    """
    for path, _ in walk_stats(folder):
        yield path


def walk_stats(folder: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every file below ``folder`` in sorted order with its ``stat`` (links followed): one stat call a file.

    A folder's files come first (sorted), then its subfolders' in turn. The walk keeps its own stack
    rather than recursing, so that a tree nested thousands of folders deep is walked, not a RecursionError.

    Raises:
        DataError: a symlink loops back to a folder above it, a link dangles, or a folder cannot be read.
    """
    folder = Path(folder)
    key = _key(stat(folder))
    ancestors = {key: folder}  # the folders from ``folder`` down to the one being listed: a loop's targets
    files, dirs = _split(folder)
    yield from files
    stack = [(key, iter(dirs))]  # per open folder: its key, and its subfolders not walked yet
    while stack:
        key, pending = stack[-1]
        nxt = next(pending, None)
        if nxt is None:
            stack.pop()
            del ancestors[key]
            continue
        path, st = nxt
        child = _key(st)
        if child in ancestors:
            link = next((p for p in (path, *path.parents) if p.is_symlink()), path)
            raise DataError(f"{link} is a symlink loop: {path} leads back to {ancestors[child]}; remove the link.")
        ancestors[child] = path
        files, dirs = _split(path)
        yield from files
        stack.append((child, iter(dirs)))


def _key(st: os.stat_result) -> tuple[int, int]:
    """What identifies a folder whatever path leads to it."""
    return st.st_dev, st.st_ino


def _entries(folder: Path) -> list[tuple[str, os.stat_result]]:
    """(name, stat following links) of every entry of ``folder``, sorted by name."""
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except OSError as err:
        raise DataError(_unreadable(folder, err)) from err
    out = []
    for entry in entries:
        try:
            out.append((entry.name, entry.stat()))
        except OSError as err:
            raise DataError(_unreadable(folder / entry.name, err)) from err
    return out


def _split(folder: Path) -> tuple[list[tuple[Path, os.stat_result]], list[tuple[Path, os.stat_result]]]:
    """The files and the subfolders of ``folder``, each with its stat, sorted by name."""
    files: list[tuple[Path, os.stat_result]] = []
    dirs: list[tuple[Path, os.stat_result]] = []
    for name, st in _entries(folder):
        (dirs if stat_module.S_ISDIR(st.st_mode) else files).append((folder / name, st))
    return files, dirs
