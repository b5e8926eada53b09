"""Results as files beside the learner, rewritten after every saved step.

- ``history.csv``: one row per step (classes, accuracy, old, new, intra-old, intra-new, forgetting,
  seconds, images/s), percentages to 2 decimals, seconds and images/s to 1; an empty cell where a
  metric has no value (intra-old and forgetting at step 1).
- ``accuracy.png`` (the ``plots`` extra, matplotlib): accuracy over the classes seen after each
  step, old and new, and Split-and-Bridge's ablation (after phase B, after phase C) where there is
  one.

Both are derived from ``learner.json``'s history alone, so they can be rebuilt from any learner
(:func:`write_results`); the learner itself never reads them.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sbcli.atomic import replacing
from sbcli.jsonutil import round_to
from sbcli.engine.loop import PhaseReport
from sbcli.learner.records import StepRecord
from sbcli.metrics import accuracy_matrix, forgetting
from sbcli.run import plots

CSV_NAME, PNG_NAME = "history.csv", "accuracy.png"
COLUMNS = ("step", "classes", "accuracy", "old", "new", "intra_old", "intra_new", "forgetting", "seconds", "images_per_s")


def step_rows(history: list[StepRecord]) -> list[dict[str, Any]]:
    """One dict per step with the CSV's columns, unrounded (NaN where there is no value)."""
    rows = []
    for t, h in enumerate(history):
        m, speed = h.metrics, images_per_second(h.phase_reports)
        acc = accuracy_matrix([g.metrics.per_task for g in history[: t + 1]])
        rows.append({"step": h.step, "classes": h.num_classes, "accuracy": m.overall, "old": m.old,
                     "new": m.new, "intra_old": m.intra_old, "intra_new": m.intra_new,
                     "forgetting": forgetting(acc), "seconds": math.nan if h.seconds is None else h.seconds,
                     "images_per_s": speed})
    return rows


def images_per_second(phases: list[PhaseReport]) -> float:
    """Training throughput of a step: images of all its phases over their seconds."""
    seconds = sum(p.seconds for p in phases)
    images = sum(p.images_per_s * p.seconds for p in phases)
    return images / seconds if seconds > 0 else math.nan


def history_csv(history: list[StepRecord]) -> str:
    """The CSV text of ``history`` (see the module docstring for the columns and rounding)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in step_rows(history):
        writer.writerow(["" if _missing(row[c]) else _cell(c, row[c]) for c in COLUMNS])
    return buffer.getvalue()


def _cell(column: str, value: Any) -> Any:
    if column in ("step", "classes"):
        return int(value)
    return round_to(value, 1 if column in ("seconds", "images_per_s") else 2)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def write_results(state: Any, out: Path) -> list[Path]:
    """Write ``history.csv`` and, when matplotlib is installed, ``accuracy.png`` into ``out``.

    ``state`` is the learner's :class:`sbcli.learner.state.LearnerState`. Each file is written beside and
    renamed in, so a reader never sees half a file. Returns the paths written.
    """
    out = Path(out)
    text = history_csv(state.history)
    writes: list[tuple[Path, Callable[[Path], object]]] = [(out / CSV_NAME, lambda p: p.write_text(text, encoding="utf-8"))]
    if plots.available() and state.history:
        title = f"{out.name}: {state.method}, {state.num_classes} classes after {state.steps} steps"
        writes.append((out / PNG_NAME, lambda p: plots.learner_accuracy(state.history, p, title)))
    for path, write in writes:
        with replacing(path, keep_suffix=True) as tmp:  # the figure's format is chosen by its suffix
            write(tmp)
    return [path for path, _ in writes]
