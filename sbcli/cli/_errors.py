"""The one error boundary: a user's error becomes one line on stderr and exit code 1."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import wraps
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from sbcli.errors import SbcliError

ERR = Console(stderr=True)


def friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command; print an SbcliError as one line (a traceback only with SBCLI_DEBUG=1)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SbcliError as err:
            if os.environ.get("SBCLI_DEBUG") == "1":
                raise
            ERR.print(f"[bold red]Error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)  # [extras] stay
            raise typer.Exit(1) from None

    return wrapper
