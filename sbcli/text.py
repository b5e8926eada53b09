"""User text (file paths, class names, model names) made safe to show on a terminal.

A name is data: a file called ``\\x1b[2J.jpg`` or a class called ``\\x1b]0;title\\x07`` must not
clear the screen or retitle the window of whoever lists it. :func:`printable` writes every control
character (C0, DEL, C1: ESC, BEL, CSI, ...) and every bidirectional override (which can make a
name read backwards) as a visible Python-style escape, and leaves all other text as it was. Rich
markup is a separate matter: the CLI also escapes ``[`` (``rich.markup.escape``) or prints a
``rich.text.Text``.
"""

from __future__ import annotations

import re

# C0 (U+0000-001F), DEL, C1 (U+0080-009F), and the bidirectional embeddings, overrides and isolates
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """``str(text)`` with every terminal control character written as a visible escape (``\\x1b``, ``\\u202e``)."""
    return _UNSAFE.sub(_escaped, str(text))
