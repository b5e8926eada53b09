"""Strict JSON at the edges: NaN and infinities (a metric without samples) become null."""

from __future__ import annotations

import math
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
