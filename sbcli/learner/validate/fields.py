"""JSON values checked against what they must be: each check takes a value and answers None when it
is fine, else one phrase for what is wrong (``must be a whole number from 1 to 512, found "x"``).

The pieces :mod:`sbcli.learner.validate.learner_json` builds ``learner.json``'s fields from (whole numbers,
finite numbers, strings from a choice, lists, objects with required and known keys, a dataclass
config), and the one sentence of a damaged file (:func:`damaged`), which the tensor checks share.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sbcli.errors import LearnerError

Check = Callable[[Any], str | None]  # a value -> None when it is fine, else what is wrong with it
RESTORE = "restore the learner from a copy or pull it again"


def damaged(where: Path | str, problem: str) -> LearnerError:
    """The one sentence of a file that is not what sbcli wrote: where, what is wrong, what to do."""
    return LearnerError(f"{where} is damaged: {problem}; {RESTORE}.")


def found(value: Any) -> str:
    """What a wrong value is, for a message: its JSON kind and, when short, the value itself."""
    kind = {bool: "true/false", str: "a string", list: "a list", dict: "an object", type(None): "null"}.get(type(value))
    text = json.dumps(value, allow_nan=True) if not isinstance(value, (list, dict)) else ""
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{kind} {text}".strip() if kind else text


def join(name: str, problem: str) -> str:
    """``name`` and what is wrong below it: ``tasks`` + ``[0].source must be ...``."""
    return f"{name}{'' if problem.startswith(('.', '[')) else ' '}{problem}"


def whole(lo: int, hi: int) -> Check:
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            return f"must be a whole number from {lo} to {hi}, found {found(v)}"
        return None
    return check


def number(lo: float, hi: float, *, lo_open: bool = False, nan: bool = False) -> Check:
    def check(v: Any) -> str | None:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if nan and isinstance(v, float) and math.isnan(v):
                return None
            if math.isfinite(v) and (lo < v if lo_open else lo <= v) and v <= hi:
                return None
        if lo <= -1e300 and hi >= 1e300:
            return f"must be a finite number, found {found(v)}"
        side = "above" if lo_open else "from"
        return f"must be a number {side} {lo} up to {hi}, found {found(v)}"
    return check


def string(choices: Callable[[], list[str]] | tuple[str, ...] | None = None, max_len: int = 4096) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, str) or len(v) > max_len:
            return f"must be a string, found {found(v)}"
        allowed = choices() if callable(choices) else choices
        if allowed is not None and v not in allowed:
            return f"must be one of {', '.join(allowed)}, found {found(v)}"
        return None
    return check


def boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"must be true or false, found {found(v)}"


def any_object(v: Any) -> str | None:
    return None if isinstance(v, dict) else f"must be a JSON object, found {found(v)}"


def optional(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


def list_of(item: Check, max_len: int, min_len: int = 0) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, list) or not min_len <= len(v) <= max_len:
            return f"must be a list of {min_len} to {max_len} items, found {found(v)}"
        for i, x in enumerate(v):
            problem = item(x)
            if problem:
                return join(f"[{i}]", problem)
        return None
    return check


def object_of(fields: dict[str, Check], required: tuple[str, ...] = (), *, closed: bool = False) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, dict):
            return f"must be a JSON object, found {found(v)}"
        missing = [k for k in required if k not in v]
        if missing:
            return f".{missing[0]} is missing"
        if closed:
            unknown = sorted(set(v) - set(fields))
            if unknown:
                return f".{unknown[0]} is not a known setting (known: {', '.join(fields)})"
        for key, sub in fields.items():
            if key in v:
                problem = sub(v[key])
                if problem:
                    return join(f".{key}", problem)
        return None
    return check


def _like_default(default: Any) -> Check:
    """A check for a config field that has no dedicated one: the JSON type of its default."""
    if isinstance(default, bool):
        return boolean
    if isinstance(default, int):
        return whole(-(1 << 53), 1 << 53)
    if isinstance(default, float):
        return number(-1e300, 1e300)
    if isinstance(default, str):
        return string(max_len=256)
    if isinstance(default, tuple):
        return list_of(number(-1e300, 1e300), 1000)
    scalar = (type(None), bool, int, float, str)
    return lambda v: None if isinstance(v, scalar) else f"must be a number, string or null, found {found(v)}"


def _like_annotation(annotation: object) -> Check | None:
    """A check for an optional field (default None) from its annotation, e.g. ``int | None``."""
    text = str(annotation)
    for name, check in (("float", number(-1e300, 1e300)), ("int", whole(-(1 << 53), 1 << 53)), ("bool", boolean),
                        ("str", string(max_len=256))):
        if name in text:
            return optional(check)
    return None


def config_of(cls: Any, known: dict[str, Check]) -> Check:
    """A dataclass config stored as a JSON object: only its own fields, each of its type."""
    fields = {}
    for f in dataclasses.fields(cls):
        default = _default_of(f)
        fields[f.name] = known.get(f.name) or (_like_annotation(f.type) if default is None else None) \
            or _like_default(default)
    return object_of(fields, closed=True)


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None

