"""The one error boundary: every failure becomes one line on stderr and a non-zero exit code.

Expected failures (an :class:`~sbcli.errors.SbcliError`, a file system refusal such as a full disk
or a read-only directory, a malformed file, running out of memory) are said in one sentence with
what to do; anything else is a bug, said in one sentence that asks for the traceback. No
traceback reaches the user unless ``SBCLI_DEBUG=1``, which re-raises everything as it was.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from functools import wraps
from typing import Any

import typer

from sbcli.cli.console import console, plain
from sbcli.errors import CommittedInterrupt, SbcliError

ERR = console(stderr=True)
INTERRUPTED = 130  # what shells report for a command stopped by Ctrl-C

_ERRNO_HINTS = {
    errno.ENOSPC: "the disk is full; free some space and run the command again",
    errno.EDQUOT: "the disk quota is used up; free some space and run the command again",
    errno.EROFS: "the file system is read-only; choose a writable location",
    errno.EACCES: "permission denied; check the permissions or choose another location",
    errno.EPERM: "the operation is not permitted; check the permissions or choose another location",
    errno.ELOOP: "a symlink loop; remove or fix the link",
    errno.ENOENT: "it does not exist; check the path",
    errno.ENOTDIR: "a part of the path is not a directory; check the path",
    errno.EISDIR: "it is a directory, not a file; give a file path",
    errno.ENAMETOOLONG: "the path is too long; use a shorter one",
    errno.EMFILE: "too many files are open; close some programs and run the command again",
    errno.EIO: "an input/output error; check the disk",
}


def _first_line(text: str, limit: int = 200) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _os_error(err: OSError) -> str:
    where = " and ".join(str(p) for p in (err.filename, err.filename2) if p is not None)
    hint = _ERRNO_HINTS.get(err.errno or 0)
    if hint is None:
        hint = f"{err.strerror or _first_line(str(err))}; check the path and run the command again"
    return f"Could not use {where}: {hint}." if where else f"A file operation failed: {hint}."


def describe(err: BaseException) -> str:
    """The one sentence the user sees for ``err``."""
    if isinstance(err, SbcliError):
        return str(err)
    if isinstance(err, OSError):
        return _os_error(err)
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return ("Out of memory; use a smaller --batch-size, --width or --memory, or close other programs "
                "and run the command again.")
    if isinstance(err, UnicodeDecodeError):
        return f"A file that should be UTF-8 text is not ({_first_line(str(err))}); check the file."
    if isinstance(err, json.JSONDecodeError):
        return f"A file that should be JSON is not ({_first_line(str(err))}); check the file."
    if type(err).__name__ == "SafetensorError":
        return (f"A safetensors file could not be read or written ({_first_line(str(err))}); check the disk "
                "(free space, permissions) and the file.")
    return (f"Unexpected error ({type(err).__name__}: {_first_line(str(err))}); this is a bug in sbcli: "
            "run the command again with SBCLI_DEBUG=1 and report the traceback.")


def _is_typer_control(err: BaseException) -> bool:
    """Typer's own exits and usage errors (they are Click's, which we do not import): let Typer handle them."""
    if isinstance(err, (typer.Exit, typer.Abort, typer.BadParameter)):
        return True
    return any(cls.__name__ == "ClickException" for cls in type(err).__mro__)


def report(err: BaseException) -> int:
    """Print ``err`` as one line on stderr; the exit code to use."""
    if isinstance(err, CommittedInterrupt):  # the learner holds the new step: "Interrupted." alone would say otherwise
        ERR.print(f"[bold yellow]Interrupted after the save:[/] {plain(str(err))}; nothing of it was lost.",
                  highlight=False, soft_wrap=True)
        return INTERRUPTED
    if isinstance(err, KeyboardInterrupt):
        ERR.print("[bold red]Interrupted.[/]", highlight=False)
        return INTERRUPTED
    ERR.print(f"[bold red]Error:[/] {plain(describe(err))}", highlight=False, soft_wrap=True)
    return 1


def debugging() -> bool:
    return os.environ.get("SBCLI_DEBUG") == "1"


def friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command; any failure becomes one line and exit code 1 (a traceback only with SBCLI_DEBUG=1)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (Exception, KeyboardInterrupt) as err:
            if debugging() or _is_typer_control(err):
                raise
            raise typer.Exit(report(err)) from None

    return wrapper
