"""The consoles sbcli prints with: at the terminal's width on a terminal, never wrapped elsewhere.

Rich wraps at 80 columns when it cannot ask a terminal for its width, which breaks sentences and
paths across lines in logs, CI output and pipes. Off a terminal these consoles are as wide as any
line sbcli prints (``COLUMNS``, when set, still decides).
"""

from __future__ import annotations

from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.text import Text

from sbcli.text import printable

UNWRAPPED = 100_000  # columns off a terminal: wider than any line or table sbcli prints


class UnwrappedConsole(Console):
    """A rich console that wraps at the terminal's width, and not at all when it is not a terminal."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self.is_terminal or (self._environ.get("COLUMNS") or "").isdigit():
            return size
        return ConsoleDimensions(UNWRAPPED, size.height)


def console(stderr: bool = False, **options: object) -> Console:
    """The console for stdout (results) or stderr (progress, notes, errors)."""
    return UnwrappedConsole(stderr=stderr, **options)  # type: ignore[arg-type]


def plain(text: object) -> str:
    """User text (a path, a class name) for a markup string: shown as written, never read as rich markup
    (``[bold]``, ``[/]``) nor obeyed by the terminal (control characters are shown as escapes)."""
    return escape(printable(text))


def cell(text: object) -> Text:
    """User text as a table cell: the same guarantee as :func:`plain`."""
    return Text(printable(text))
