"""JSON at the edges: strict (NaN and infinities, a metric without samples, become null) and rounded.

:func:`rounded` is what ``--json`` prints: percentages to 2 decimals and seconds (and images/s)
to 1, chosen by key name, at any depth; every other number (losses, learning rates, the ONNX
parity's differences, probabilities) is left exact. Files the learner keeps (``learner.json``) are
never rounded.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

# Keys whose numbers are percentages (accuracies, their averages, forgetting), wherever they sit.
PERCENT_KEYS = frozenset({
    "overall", "old", "new", "intra_old", "intra_new", "per_task", "accuracy", "accuracy_matrix", "accuracy_per_step",
    "last", "forgetting",
    "avg_incremental_2_to_T", "avg_incremental_1_to_T", "avg_2_to_T", "avg_1_to_T",
})
# Keys whose numbers are durations in seconds or throughputs.
SECONDS_KEYS = frozenset({"seconds", "images_per_s"})
DIGITS = {**dict.fromkeys(PERCENT_KEYS, 2), **dict.fromkeys(SECONDS_KEYS, 1)}


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


def rounded(value: Any, digits: int | None = None) -> Any:
    """``value`` with the numbers under :data:`PERCENT_KEYS` and :data:`SECONDS_KEYS` rounded, at any depth."""
    if isinstance(value, dict):
        return {k: rounded(v, DIGITS.get(k)) for k, v in value.items()}  # a dict's own keys decide for it
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    if digits is not None and isinstance(value, float):
        return round_to(value, digits)
    return value



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
