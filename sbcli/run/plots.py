"""One learner's ``accuracy.png``, drawn from its history with matplotlib (the ``plots`` extra).

:func:`learner_accuracy`: accuracy, old and new accuracy after each step, and Split-and-Bridge's
accuracy after phases B and C where the learner has them. The bench draws its figures with the same
helpers (:mod:`sbcli.bench.figures`). matplotlib is imported inside the functions; figures are
drawn without pyplot, so the process's own backend (a notebook's) is never switched.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import TYPE_CHECKING

from sbcli.methods.split_bridge import SplitBridgeRecord

if TYPE_CHECKING:
    from sbcli.learner.records import StepRecord

OLD_COLOR, NEW_COLOR = "#4c72b0", "#dd8452"


def available() -> bool:
    """Whether matplotlib can be imported."""
    return importlib.util.find_spec("matplotlib") is not None


def figure(width: float, height: float):
    """A matplotlib ``Figure`` of its own, drawn by Agg when it is saved. No pyplot: the process's backend
    and pyplot's figure list stay as they were, so a notebook that calls the API keeps its own backend."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def learner_accuracy(history: list[StepRecord], path: Path, title: str) -> Path:
    """Draw one learner's accuracy, old and new accuracy (and S&B's ablation) per step; returns ``path``."""
    fig = figure(8.0, 4.2)
    ax = fig.subplots()
    classes = [h.num_classes for h in history]
    lines = (("accuracy", "overall", {"color": "#222222", "marker": "o", "linewidth": 2.2}),
             ("old classes", "old", {"color": OLD_COLOR, "marker": "s", "linestyle": "--"}),
             ("new classes", "new", {"color": NEW_COLOR, "marker": "^", "linestyle": "--"}))
    for label, key, style in lines:
        ax.plot(classes, [_value(getattr(h.metrics, key)) for h in history], label=label, markersize=5, **style)
    ablation = [(h.num_classes, r) for h in history if (r := SplitBridgeRecord.from_json(h.record)) is not None]
    phases = (("S&B split only (after B)", [(n, r.after_B) for n, r in ablation], {"color": "#2ca02c", "marker": "x"}),
              ("S&B split + bridge (after C)", [(n, r.after_C) for n, r in ablation], {"color": "#d62728", "marker": "+"}))
    for label, measured, style in phases:
        points = [(n, m.overall) for n, m in measured if m is not None]
        if points:
            ax.plot(*zip(*points, strict=True), label=label, linestyle="none", markersize=9, **style)
    ax.set_xticks(classes)
    ax.set_ylim(0, 102)
    ax.set_xlabel("classes seen")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside: no point hidden
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def _value(value: float | None) -> float:
    return math.nan if value is None else value


def save_figure(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
