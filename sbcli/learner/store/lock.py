"""One writer per learner: ``filelock`` on ``LEARNER/.sbcli.lock`` plus a JSON note of who holds it.

``train``, ``add-task``, ``rollback`` and ``pull -o`` take the lock before any work; a second writer
is refused at once with one sentence naming the holder (pid, host, command, since when). The lock
is an OS file lock (``flock``), which the kernel releases when its process ends however it ends,
so the lock of a killed process is simply taken over by the next writer (the stale note is then
rewritten). Readers never lock: they read ``learner.json`` once and then only the immutable files
it names.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from sbcli.atomic import write_atomic
from sbcli.errors import LearnerError
from sbcli.learner.store import legacy
from sbcli.learner.store.commit import only_leftovers
from sbcli.learner.store.layout import LOCK_FILE, LOCK_INFO, check_confined, holds_learner


def holder_note(command: str) -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
            "since": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())}


def describe_holder(folder: Path) -> str:
    """Who holds the lock, from its note (the note may not be written yet)."""
    try:
        note = json.loads((folder / LOCK_INFO).read_text(encoding="utf-8"))
        return (f"sb {note['command']} (pid {note['pid']} on {note['host']}, since {note['since']})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (it has not written who it is yet)"


@contextmanager
def writer_lock(folder: Path, command: str, *, create: bool = False, enabled: bool = True) -> Iterator[None]:
    """Hold the writer lock of the learner at ``folder`` for the block.

    Args:
        folder: the learner directory.
        command: what the holder runs (``add-task``), named to a refused writer.
        create: make ``folder`` (mode from the umask) when it does not exist; if the block fails
            before a learner was committed there, the folder is removed again.
        enabled: False in the processes that do not write (the other ranks of a distributed run).

    Raises:
        LearnerError: another writer holds the lock, or ``folder`` is not a directory.
    """
    if not enabled:
        yield
        return
    legacy.recover(folder, writer=True)  # and what an interrupted 0.1 save left beside it
    made = create and not folder.exists()
    if made:
        folder.mkdir(parents=True)
    if not folder.is_dir():
        raise LearnerError(f"No learner at {folder}; give the directory that `sb train --out` wrote.")
    check_confined(folder)  # before the lock file is opened: a link there would be followed
    lock = FileLock(str(folder / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise LearnerError(f"The learner at {folder} is being written by {describe_holder(folder)}; "
                           "wait until it ends, or stop it, and run again.") from None
    except OSError as err:
        raise LearnerError(f"Cannot lock the learner at {folder} for writing ({err.strerror or err}); "
                           "check that the directory is writable.") from err
    try:
        try:
            write_atomic(folder / LOCK_INFO, json.dumps(holder_note(command)))
        except OSError as err:
            raise LearnerError(f"Cannot write to the learner at {folder} ({err.strerror or err}); "
                               "free some space or fix its permissions, and run again.") from err
        yield
    except BaseException:
        if made and not holds_learner(folder) and only_leftovers(folder):  # created, never committed: remove it
            shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            (folder / LOCK_INFO).unlink()
        lock.release()
