"""A bench run: every cell of the grid run, resumed or skipped, then the table written.

A finished cell is skipped and a partly finished one resumed from its last completed step, so an
interrupted grid is continued by running the same command again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sbcli.bench.grid import BenchPlan, Cell, cell_options, cells, check_budget, dataset_kind, steps_done
from sbcli.bench.report import ran_on
from sbcli.bench.table import collect, write_outputs


@dataclass
class BenchResult:
    """Where the bench wrote its outputs, which cells it ran or skipped, and the table itself."""

    out: Path
    ran: list[Cell]
    skipped: list[Cell]
    table: dict
    files: list[Path]
    notes: list[str]


CellFn = Callable[[Cell, int, int, str], None]


def run_bench(plan: BenchPlan, out: Path, *, plots: bool = True, on_cell: CellFn | None = None,
              on_progress: Callable | None = None, on_step: Callable | None = None) -> BenchResult:
    """Run (or resume) every cell of the grid, then write the table and the figures.

    Args:
        plan: the grid and its budget.
        out: the bench directory.
        plots: also draw the PNGs (needs matplotlib, the ``plots`` extra).
        on_cell: told ``(cell, index, count, "run" | "resume" | "skip")`` before each cell.
        on_progress, on_step: passed to :func:`sbcli.api.train`.
    """
    from sbcli import api

    out = Path(out)
    check_budget(plan, out)
    kind = dataset_kind(plan)
    grid, ran, skipped = cells(plan), [], []
    for index, cell in enumerate(grid, 1):
        done = steps_done(cell.directory(out))
        action = "skip" if done >= cell.tasks else ("resume" if done else "run")
        if on_cell:
            on_cell(cell, index, len(grid), action)
        if action == "skip":
            skipped.append(cell)
            continue
        seq, run = cell_options(plan, cell, kind)
        api.train(seq, run, cell.directory(out), resume=action == "resume", on_progress=on_progress, on_step=on_step)
        ran.append(cell)
    table = {**collect(plan, out, kind), "ran": ran_on(plan)}
    files, notes = write_outputs(table, out, plots)
    return BenchResult(out, ran, skipped, table, files, notes)
