"""Rendering: results (tables or JSON) on stdout; the progress on stderr is :mod:`sbcli.cli.progress`."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.table import Table

from sbcli.cli.console import console
from sbcli.jsonutil import strict

if TYPE_CHECKING:
    from sbcli.api import StepRecord, Summary

ERR = console(stderr=True)
OUT = console(highlight=False)


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def history_table(history: list[StepRecord], title: str = "Accuracy after each step (%)") -> Table:
    """One row per step: classes, accuracy, old, new, intra-old, intra-new (per task: :func:`matrix_table`)."""
    table = Table(title=title)
    for col in ("step", "classes", "accuracy", "old", "new", "intra-old", "intra-new"):
        table.add_column(col, justify="right")
    for h in history:  # a metric that was not measured (no test images of those classes) shows as "-"
        m = h.metrics
        table.add_row(str(h.step), str(h.num_classes), fmt(m.overall), fmt(m.old), fmt(m.new), fmt(m.intra_old),
                      fmt(m.intra_new))
    return table


def matrix_table(history: list[StepRecord], now: list[float] | None = None) -> Table:
    """The accuracy matrix: row t is after step t, column j the accuracy on task j's classes.

    ``now``, when given, is a last row: the learner evaluated now (e.g. on another test folder).
    """
    rows = [(f"after {h.step}", h.metrics.per_task) for h in history]
    if now is not None:
        rows.append(("now", now))
    width = max((len(r) for _, r in rows), default=0)
    table = Table(title="Accuracy matrix (%): each task's classes after each step")
    table.add_column("step", justify="left")
    for j in range(width):
        table.add_column(f"task {j + 1}", justify="right")
    for name, row in rows:
        table.add_row(name, *(fmt(v) for v in row), *([""] * (width - len(row))))
    return table


def closing_tables(history: list[StepRecord], summary: Summary) -> list[Table]:
    """What `sb train`, `sb add-task` and `sb evaluate` end with: the steps, the S&B ablation, the summary."""
    tables = [history_table(history)]
    ablation = ablation_table(history)
    if ablation is not None:
        tables.append(ablation)
    tables.append(summary_table(summary))
    return tables


def ablation_table(history: list[StepRecord]) -> Table | None:
    """Split only (after B) / split + bridge (after C) / + WA (/ + balance), per incremental step of Split-and-Bridge.

    A step that was not split (bf = 1) shows "-" for "after B" and the cross norm; "+WA" is "-" when
    the learner does not weight-align (``--inference none``). With ``--balance-epochs`` a "+balance"
    column shows the step's final accuracy, and "+WA" the accuracy before balancing.
    """
    from sbcli.api import SplitBridgeRecord

    rows = [(h, r) for h in history if (r := SplitBridgeRecord.from_json(h.record)) is not None]
    if not rows:
        return None
    balanced = any(r.before_balance is not None for _, r in rows)
    table = Table(title="Split-and-Bridge ablation: accuracy (%)")
    columns = ("step", "split (after B)", "split+bridge (after C)", "+WA", *(("+balance",) if balanced else ()),
               "cross norm before disconnect")
    for col in columns:
        table.add_column(col, justify="right")
    for h, r in rows:
        final = h.metrics.overall
        before_balance = final if r.before_balance is None else r.before_balance.overall
        with_wa = before_balance if r.wa_factor is not None else None
        balance = (fmt(final) if r.before_balance is not None else "-",) if balanced else ()
        table.add_row(str(h.step), fmt(None if r.after_B is None else r.after_B.overall), fmt(r.after_C.overall),
                      fmt(with_wa), *balance, fmt(r.cross_norm_before_disconnect, 4))
    return table


def summary_table(summary: Summary) -> Table:
    table = Table(title="Summary (%)")
    for col in ("avg incr. acc (2..T, paper)", "avg incr. acc (1..T)", "last", "forgetting"):
        table.add_column(col, justify="right")
    table.add_row(fmt(summary.avg_incremental_2_to_T), fmt(summary.avg_incremental_1_to_T), fmt(summary.last),
                  fmt(summary.forgetting))
    return table


def png_note(learner: Any) -> str:
    """`` and accuracy.png`` when the learner directory has one (the plots extra draws it)."""
    from pathlib import Path

    return " and accuracy.png" if (Path(learner) / "accuracy.png").is_file() else ""


def print_json(data: Any) -> None:
    """Strict JSON on stdout: NaN (no value, e.g. intra-old at step 1) becomes null; every number is
    exact, as ``learner.json`` keeps it (tables round, JSON does not)."""
    OUT.out(json.dumps(strict(data), indent=2), highlight=False)


@dataclass(frozen=True)
class Output:
    """Where a command's result goes, decided in one place: its JSON on stdout (``--json``), or
    what ``show`` renders (tables and lines). Every command with ``--json`` ends through it."""

    json: bool

    def result(self, data: Any, show: Callable[[], None]) -> None:
        if self.json:
            print_json(data)
        else:
            show()
