"""The table of a bench, from its finished cells: ``table.md``, ``table.json`` and the figures.

Average incremental accuracy over steps 2..T (the paper's Table 1 metric) and over 1..T, and the
accuracy after the last step: one row per method, one column per task count, beside the paper's own
numbers when the dataset is one of its own. With matplotlib, ``accuracy_per_step.png`` (Figures 3
and 4) and ``intra_old_new.png`` (Figure 5).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sbcli.bench.grid import BENCH_METHODS, BenchPlan, Cell, steps_done
from sbcli.bench.report import class_order_text, threads_text, what_ran
from sbcli.jsonutil import strict

if TYPE_CHECKING:
    from sbcli.learner.records import StepRecord

# docs/method.md §9: the paper's Table 1 (average over steps 2..T, ResNet-18, memory 2000, 200 epochs a phase).
PAPER_TABLE1 = {
    "cifar100": {"std-icarl": [68.14, 59.50, 55.60, 60.04], "std-bic": [69.96, 67.07, 60.65, 49.89],
                 "std-wa": [69.28, 67.64, 63.72, 55.29], "dd-wa": [68.84, 67.68, 63.12, 58.08],
                 "sb-wa": [69.60, 68.62, 66.97, 61.12], "joint": [77.03, None, None, None]},
    "tiny-imagenet": {"std-icarl": [55.72, 51.32, 48.65, 46.56], "std-bic": [58.16, 55.23, 48.47, 43.81],
                      "std-wa": [57.96, 55.97, 51.61, 47.57], "dd-wa": [58.33, 56.80, 53.12, 48.14],
                      "sb-wa": [60.52, 57.16, 54.81, 51.63], "joint": [62.35, None, None, None]},
}
PAPER_TASKS = (2, 5, 10, 20)


def cell_summary(history: list[StepRecord]) -> dict:
    """One cell's numbers: both averages, last, the per-step curves (accuracy, intra-old/new) and
    what ran: the epochs each step trained (every phase) and the precision of its phases."""
    from sbcli.metrics import history_summary

    overall = [h.metrics.overall for h in history]
    later = [h.metrics for h in history[1:]]
    s = history_summary(history)
    return {
        "avg_2_to_T": s.avg_incremental_2_to_T,
        "avg_1_to_T": s.avg_incremental_1_to_T,
        "last": s.last,
        "classes": [h.num_classes for h in history],
        "accuracy": overall,
        "intra_old": _mean([m.intra_old for m in later]),
        "intra_new": _mean([m.intra_new for m in later]),
        "old": _mean([m.old for m in later]),
        "new": _mean([m.new for m in later]),
        "seconds": round(sum(h.seconds for h in history if h.seconds is not None), 1),
        "epochs_per_step": [h.epochs_trained for h in history],
        "precision": sorted({p.precision for h in history for p in h.phase_reports}),
        **_network_summary(history),
    }


def _network_summary(history: list[StepRecord]) -> dict:
    """The network's own accuracy beside a rule outside it (STD + iCaRL's nearest mean), when recorded."""
    from sbcli.metrics import summary

    network = [h.network_metrics for h in history if h.network_metrics is not None]
    if not history or len(network) < len(history):
        return {}
    s = summary([m.overall for m in network], [m.per_task for m in network])
    return {"network": {"avg_2_to_T": s.avg_incremental_2_to_T, "avg_1_to_T": s.avg_incremental_1_to_T,
                        "last": s.last, "accuracy": [m.overall for m in network]}}


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def collect(plan: BenchPlan, out: Path, kind: str) -> dict:
    """The table of the grid from its finished cells (an unfinished cell is left out of the numbers)."""
    from sbcli.learner.state import read_state

    rows = []
    for name in plan.methods:
        row = {"name": name, "label": BENCH_METHODS.get(name).label, "cells": {}}
        for tasks in plan.task_counts:
            directory = Cell(name, tasks).directory(out)
            if steps_done(directory) >= tasks:
                state = read_state(directory)
                row["cells"][str(tasks)] = {**cell_summary(state.history), "rho": getattr(state.method_config, "rho", None)}
        rows.append(row)
    return {"dataset": kind, "task_counts": list(plan.task_counts), "budget": plan.budget(), "methods": rows,
            "paper": paper_numbers(kind, plan.methods, plan.task_counts)}


def paper_numbers(kind: str, methods: tuple[str, ...], task_counts: tuple[int, ...]) -> dict | None:
    """The paper's Table 1 entries for the same rows and columns, when the dataset is one of its own."""
    table = PAPER_TABLE1.get(kind)
    if table is None:
        return None
    index = {t: i for i, t in enumerate(PAPER_TASKS)}
    return {m: {str(t): table[m][index[t]] for t in task_counts if t in index} for m in methods if m in table}


def _epochs(count: int) -> str:
    return f"{count} epoch" + ("" if count == 1 else "s")


def _fmt(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def _grid(table: dict, key: str) -> list[str]:
    heads = [f"{t} tasks" for t in table["task_counts"]]
    lines = ["| method | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for row in table["methods"]:
        cells = [row["cells"].get(str(t), {}) for t in table["task_counts"]]
        lines.append(f"| {row['label']} | " + " | ".join(_fmt(c.get(key)) for c in cells) + " |")
        if any("network" in c for c in cells):  # the rule's accuracy above, the network's own output here
            values = [_fmt(c.get("network", {}).get(key)) for c in cells]
            lines.append(f"| {row['label']}, network output | " + " | ".join(values) + " |")
    return lines


def table_markdown(table: dict) -> str:
    """Table 1 as Markdown: 2..T and 1..T averages, last-step accuracy, and the paper's numbers when known."""
    b = table["budget"]
    run, seq = b["run"], b["sequence"]
    lines = [f"# Average incremental accuracy (top-1 %) on {seq['source'] or 'demo'}", "",
             f"Budget: {run['arch']} width {run['width']}, {_epochs(run['train']['epochs'])} a phase, batch "
             f"{run['train']['batch_size']}, lr {run['train']['lr']}, memory {run['memory']} ({run['selection']}), "
             f"classes {seq['classes'] or 'all'}, image size {seq['image_size'] or 'native'}, seed {run['seed']}, "
             f"class order {class_order_text(seq['order_seed'])}, precision {run['train'].get('precision', 'auto')}"
             f"{threads_text(table)}.", "",
             "## Steps 2..T (the paper's Table 1 metric)", "", *_grid(table, "avg_2_to_T"), "",
             "## Steps 1..T", "", *_grid(table, "avg_1_to_T"), "",
             "## Accuracy after the last step", "", *_grid(table, "last"), "", *what_ran(table)]
    if table.get("paper"):
        heads = [f"{t} tasks" for t in table["task_counts"]]
        lines += ["## The paper's Table 1 (steps 2..T; ResNet-18, memory 2000, 200 epochs a phase)", "",
                  "| method | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
        for row in table["methods"]:
            paper = table["paper"].get(row["name"], {})
            lines.append(f"| {row['label']} | " + " | ".join(_fmt(paper.get(str(t))) for t in table["task_counts"]) + " |")
        lines.append("")
    return "\n".join(lines)


def write_outputs(table: dict, out: Path, plots: bool) -> tuple[list[Path], list[str]]:
    """table.md, table.json and (when asked and possible) the two figures; notes say what was left out."""
    from sbcli.bench.figures import accuracy_per_step, available, intra_old_new

    out = Path(out)
    files = [out / "table.md", out / "table.json"]
    files[0].write_text(table_markdown(table), encoding="utf-8")
    files[1].write_text(json.dumps(strict(table), indent=2) + "\n", encoding="utf-8")
    notes = []
    if plots and not available():
        notes.append('Figures skipped: matplotlib is not installed (pip install "sbcli[plots]").')
    elif plots:
        files.append(accuracy_per_step(table, out / "accuracy_per_step.png"))
        files.append(intra_old_new(table, out / "intra_old_new.png"))
    return files, notes
