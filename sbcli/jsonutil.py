"""JSON at the edges: strict (NaN and infinities, a metric without samples, become null), and rounding for display.

:func:`strict` is what ``--json`` prints: every number exact, as ``learner.json`` keeps it;
:func:`round_to` is for files people read (``history.csv``).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any


def strict(value: Any) -> Any:
    """``value`` with every non-finite float, at any depth of dicts and lists, replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def round_to(value: float, digits: int) -> float:
    """``round(value, digits)`` for a finite float; anything else unchanged."""
    return round(value, digits) if isinstance(value, float) and math.isfinite(value) else value


def config_from_json(cls: type, data: dict[str, Any]) -> Any:
    """A config dataclass from its JSON object: fields an older writer did not know take their defaults, and
    tuples (which JSON stores as lists) come back as tuples.

    Raises:
        TypeError: a field ``cls`` does not have.
    """
    hints = typing.get_type_hints(cls)
    tuples = {f.name for f in dataclasses.fields(cls) if typing.get_origin(hints[f.name]) is tuple
              or any(typing.get_origin(a) is tuple for a in typing.get_args(hints[f.name]))}
    return cls(**{k: tuple(v) if k in tuples and isinstance(v, list) else v for k, v in data.items()})
