"""Metrics of class-incremental learning, as functions of arrays (docs/method.md §8).

``acc[t, j]`` is the accuracy (in %) on the test images of task j's classes after learning
step t; entries with j > t are NaN. Nothing is rounded here: round at display time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch


def top1_counts(scores: torch.Tensor, labels: torch.Tensor) -> tuple[int, int]:
    """(images whose top-1 is right, images)."""
    return int((scores.argmax(1) == labels).sum()), len(labels)


def percent(correct: int, total: int) -> float:
    """``correct`` of ``total`` in %, from the counts (190 of 1,000 is 19.0, not a float32 mean's 18.99999976...);
    NaN for no samples."""
    return 100.0 * correct / total if total else float("nan")


def top1(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy in %, NaN for no samples."""
    return percent(*top1_counts(scores, labels))


@dataclass(frozen=True)
class StepMetrics:
    """Accuracy after one step: overall, per task, old/new and intra-old/intra-new (in %), and the counts
    (right, images) each was computed from."""

    overall: float
    per_task: list[float]
    old: float
    new: float
    intra_old: float
    intra_new: float
    counts: dict | None = None  # name -> [right, images]; "per_task": one pair per task

    def to_json(self) -> dict:
        out = {"overall": self.overall, "per_task": self.per_task, "old": self.old, "new": self.new,
               "intra_old": self.intra_old, "intra_new": self.intra_new}
        return out if self.counts is None else {**out, "counts": self.counts}

    @classmethod
    def from_json(cls, data: dict) -> StepMetrics:
        """The metrics as ``learner.json`` keeps them (a learner written before the counts has none; a metric
        without a value is null there, NaN in an older learner, NaN here)."""
        def value(v: float | None) -> float:
            return math.nan if v is None else v  # null (strict JSON) or absent: not measured (one NaN object, as json reads NaN)

        return cls(value(data["overall"]), [value(v) for v in data["per_task"]], value(data.get("old")),
                   value(data.get("new")), value(data.get("intra_old")), value(data.get("intra_new")),
                   data.get("counts"))


def step_metrics(scores: torch.Tensor, labels: torch.Tensor, task_of_class: list[int],
                 current: int | None = None) -> StepMetrics:
    """Metrics of one step from the scores over every seen class.

    old/new: overall argmax on old-class / current-task images. intra-old: argmax over the old
    classes' scores on old images; intra-new: argmax over the current task's scores on its images.
    ``current``: the step's task (default: the last task with a class); a step that brought no class (more
    images of known classes, classes taken out) has no new images and its own, empty, per-task entry.
    """
    task_of = torch.tensor(task_of_class)[labels]
    current = max(task_of_class) if current is None else max(current, max(task_of_class))
    num_old = sum(1 for t in task_of_class if t < current)
    is_old = task_of < current
    counts = {
        "overall": top1_counts(scores, labels),
        "per_task": [top1_counts(scores[task_of == t], labels[task_of == t]) for t in range(current + 1)],
        "old": top1_counts(scores[is_old], labels[is_old]),
        "new": top1_counts(scores[~is_old], labels[~is_old]),
        "intra_old": top1_counts(scores[is_old, :num_old], labels[is_old]) if num_old else (0, 0),
        "intra_new": (top1_counts(scores[~is_old, num_old:], labels[~is_old] - num_old)
                      if num_old < scores.shape[1] else (0, 0)),  # a step that brought no class: none new
    }
    return StepMetrics(
        overall=percent(*counts["overall"]),
        per_task=[percent(*c) for c in counts["per_task"]],
        old=percent(*counts["old"]),
        new=percent(*counts["new"]),
        intra_old=percent(*counts["intra_old"]),
        intra_new=percent(*counts["intra_new"]),
        counts={k: [list(c) for c in v] if k == "per_task" else list(v) for k, v in counts.items()},
    )


def accuracy_matrix(rows: list[list[float]]) -> np.ndarray:
    """Stack per-step per-task accuracies into acc[t, j], NaN above the diagonal."""
    size = len(rows)
    acc = np.full((size, size), np.nan)
    for t, row in enumerate(rows):
        acc[t, : len(row)] = row
    return acc


def average_incremental(overall: list[float], skip_first: bool = True) -> float:
    """Average incremental accuracy: the mean over steps 2..T (the paper's) or 1..T."""
    values = overall[1:] if skip_first else overall
    return float(np.mean(values)) if values else float("nan")


def forgetting(acc: np.ndarray) -> float:
    """Mean over earlier tasks j of max_{t<T} acc[t, j] - acc[T, j]; NaN with one step. A task with no value
    at the last step (every class of it taken out by `sb forget`, or no test image of it) is left out."""
    last = acc.shape[0] - 1
    if last < 1:
        return float("nan")
    drops = [np.nanmax(acc[:last, j]) - acc[last, j] for j in range(last)
             if not np.isnan(acc[:last, j]).all() and not np.isnan(acc[last, j])]
    return float(np.mean(drops)) if drops else float("nan")


@dataclass(frozen=True)
class Summary:
    """A sequence's summary (in %): average incremental accuracy over steps 2..T (the paper's) and over 1..T,
    the last step's accuracy and the forgetting (points); NaN where there is no value."""

    avg_incremental_2_to_T: float
    avg_incremental_1_to_T: float
    last: float
    forgetting: float

    def to_json(self) -> dict:
        return {"avg_incremental_2_to_T": self.avg_incremental_2_to_T, "avg_incremental_1_to_T": self.avg_incremental_1_to_T,
                "last": self.last, "forgetting": self.forgetting}


def summary(overall: list[float], per_task_rows: list[list[float]]) -> Summary:
    """The sequence's summary: both averages, last-step accuracy and forgetting."""
    return Summary(average_incremental(overall, skip_first=True), average_incremental(overall, skip_first=False),
                   overall[-1] if overall else float("nan"), forgetting(accuracy_matrix(per_task_rows)))


class Step(Protocol):
    """A learned step as a learner's history holds it (``sbcli.learner.records.StepRecord``): its metrics."""

    @property
    def metrics(self) -> StepMetrics: ...


def history_summary(history: Sequence[Step]) -> Summary:
    """:func:`summary` of a learner's history (one record per step, with its ``metrics``)."""
    return summary([h.metrics.overall for h in history], [h.metrics.per_task for h in history])
