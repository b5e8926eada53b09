"""Rebuild the paper's comparison: a grid of methods x task counts, one budget, resumable.

Each cell of the grid is an ordinary learner directory, ``<out>/cells/<method>-T<tasks>``,
trained with :func:`sbcli.api.train`: a finished cell is skipped, a partly finished one is
resumed from its last completed step, so an interrupted grid is continued by running the same
command again. ``<out>/bench.json`` records the budget; another budget in the same directory is
refused rather than mixed into one table.

From the cells come ``table.md`` and ``table.json`` (average incremental accuracy over steps
2..T, the paper's Table 1 metric, and over 1..T; one row per method, one column per task count)
and, with matplotlib, ``accuracy_per_step.png`` (Figures 3 and 4) and ``intra_old_new.png``
(Figure 5).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sbcli.bench.report import class_order_text, epochs_text, ran_on, ran_text, threads_text, what_ran
from sbcli.errors import ConfigError
from sbcli.jsonutil import strict
from sbcli.methods import METHODS
from sbcli.registry import Registry


@dataclass(frozen=True)
class BenchMethod:
    """A row of the table: a method with its options, named as the paper names it."""

    name: str
    label: str
    method: str
    options: dict = field(default_factory=dict)


BENCH_METHODS: Registry[BenchMethod] = Registry("bench method")
PAPER_ORDER = ("finetune", "std-icarl", "std-bic", "std-wa", "dd-wa", "sb-wa", "joint")
for _row in (BenchMethod("finetune", "Fine-tuning", "finetune"),
             BenchMethod("std-icarl", "STD + iCaRL", "std", {"inference": "icarl"}),
             BenchMethod("std-bic", "STD + BiC", "std", {"inference": "bic"}),
             BenchMethod("std-wa", "STD + WA", "std", {"inference": "wa"}),
             BenchMethod("std", "STD (KD + CE, plain head)", "std", {"inference": "none"}),  # Table 2's "KD + CE"
             BenchMethod("dd-wa", "DD + WA", "dd", {"inference": "wa"}),
             BenchMethod("sb-wa", "S&B + WA", "sb", {"inference": "wa"}),
             BenchMethod("joint", "Oracle (joint)", "joint")):
    BENCH_METHODS.register(_row.name)(_row)

# docs/method.md §6: rho of S&B per dataset and task count (1.0 where the paper gives none).
PAPER_RHO = {"cifar100": {2: 1.0, 5: 1.35, 10: 1.15, 20: 1.0},
             "tiny-imagenet": {2: 1.0, 5: 1.35, 10: 1.2, 20: 1.113}}

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


@dataclass(frozen=True)
class BenchPlan:
    """A grid: which methods over which task counts, with one sequence and run budget.

    ``seq.tasks`` and ``run.method`` are set per cell; everything else is the shared budget.
    ``rho`` overrides the paper's rho for S&B (None: the paper's value for the task count).
    """

    methods: tuple[str, ...]
    task_counts: tuple[int, ...]
    seq: Any  # api.SequenceOptions
    run: Any  # api.RunOptions
    rho: float | None = None

    def __post_init__(self) -> None:
        for name in self.methods:
            BENCH_METHODS.get(name)
        if not self.methods or not self.task_counts:
            raise ConfigError("A bench needs at least one method and one task count, e.g. --methods sb-wa --tasks 2.")
        if any(t < 1 for t in self.task_counts):
            raise ConfigError("--tasks takes positive task counts, e.g. 2,5,10.")

    def budget(self) -> dict:
        """What must be the same across the cells of one table (JSON-normalised)."""
        seq = {k: v for k, v in dataclasses.asdict(self.seq).items() if k not in ("tasks", "base", "increment")}
        run = {k: v for k, v in dataclasses.asdict(self.run).items() if k not in ("method", "method_options", "device")}
        for key in SPEED_KEYS:  # how fast, not what is computed: a bench may resume with other values
            run["train"].pop(key)
        return json.loads(json.dumps({"sequence": seq, "run": run, "rho": self.rho}))


SPEED_KEYS = ("compile", "cuda_graphs", "threads", "eval_batch_size")  # engine settings that change the speed, not the results


@dataclass(frozen=True)
class Cell:
    method: str
    tasks: int

    def directory(self, out: Path) -> Path:
        return Path(out) / "cells" / f"{self.method}-T{self.tasks}"


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


def cells(plan: BenchPlan) -> list[Cell]:
    """The grid in running order: every method of the smallest task count first."""
    return [Cell(m, t) for t in plan.task_counts for m in plan.methods]


def dataset_kind(plan: BenchPlan) -> str:
    """The source's kind (``tiny-imagenet``, ``cifar100``, ``folder``, ...), for rho and the paper's numbers."""
    from sbcli.data.catalog import resolve_spec

    seq = plan.seq
    return resolve_spec(seq.source, test=seq.test, image_size=seq.image_size, data_root=seq.data_root,
                        download=seq.download)["kind"]


def cell_options(plan: BenchPlan, cell: Cell, kind: str) -> tuple[Any, Any]:
    """(SequenceOptions, RunOptions) of one cell: the shared budget with its method and task count."""
    row = BENCH_METHODS.get(cell.method)
    options = dict(row.options)
    if "rho" in {f.name for f in dataclasses.fields(METHODS.get(row.method).config)}:  # S&B's split ratio
        options["rho"] = plan.rho if plan.rho is not None else PAPER_RHO.get(kind, {}).get(cell.tasks, 1.0)
    seq = dataclasses.replace(plan.seq, tasks=cell.tasks, base=None, increment=None)
    run = dataclasses.replace(plan.run, method=row.method, method_options=options)
    return seq, run


def steps_done(directory: Path) -> int:
    """Completed steps of the learner in ``directory`` (0 when there is none yet)."""
    from sbcli.learner.state import read_state

    if not (directory / "learner.json").is_file():
        return 0
    return read_state(directory).steps


def check_budget(plan: BenchPlan, out: Path) -> None:
    """Record the budget in ``bench.json``, or refuse a directory that holds another budget.

    Raises:
        ConfigError: ``out`` was started with other options.
    """
    path = Path(out) / "bench.json"
    budget = plan.budget()
    if path.is_file():
        stored = json.loads(path.read_text(encoding="utf-8"))
        _complete(stored.get("run", {}).get("train", {}))
        if stored != budget:
            changed = sorted(_diff_keys(stored, budget))
            raise ConfigError(f"{out} holds a bench run with other options ({', '.join(changed)}); rerun with the same "
                              "options to resume it, or choose another --out.")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(budget, indent=2) + "\n", encoding="utf-8")


def _complete(stored_train: dict) -> None:
    """An older bench.json's engine settings as today's: speed keys dropped, later settings at their defaults."""
    from sbcli.engine.loop import TrainConfig

    for key in SPEED_KEYS:
        stored_train.pop(key, None)
    defaults = json.loads(json.dumps(dataclasses.asdict(TrainConfig())))
    for key, value in defaults.items():
        if key not in SPEED_KEYS:
            stored_train.setdefault(key, value)


def _diff_keys(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            keys += _diff_keys(va, vb, f"{prefix}{k}.")
        elif va != vb:
            keys.append(prefix + k)
    return keys


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


def cell_summary(history: list[dict]) -> dict:
    """One cell's numbers: both averages, last, the per-step curves (accuracy, intra-old/new) and
    what ran: the epochs each step trained (every phase) and the precision of its phases."""
    from sbcli.metrics import history_summary
    from sbcli.run.plan import actual_epochs

    overall = [h["metrics"]["overall"] for h in history]
    later = history[1:]
    s = history_summary(history)
    return {
        "avg_2_to_T": s["avg_incremental_2_to_T"],
        "avg_1_to_T": s["avg_incremental_1_to_T"],
        "last": s["last"],
        "classes": [h["num_classes"] for h in history],
        "accuracy": overall,
        "intra_old": _mean([h["metrics"]["intra_old"] for h in later]),
        "intra_new": _mean([h["metrics"]["intra_new"] for h in later]),
        "old": _mean([h["metrics"]["old"] for h in later]),
        "new": _mean([h["metrics"]["new"] for h in later]),
        "seconds": round(sum(h.get("seconds", 0.0) for h in history), 1),
        "epochs_per_step": actual_epochs(history),
        "precision": sorted({p.get("precision", "fp32") for h in history for p in h.get("phases", [])}),
        **_network_summary(history),
    }


def _network_summary(history: list[dict]) -> dict:
    """The network's own accuracy beside a rule outside it (STD + iCaRL's nearest mean), when recorded."""
    from sbcli.metrics import history_summary

    if not history or not all("network_metrics" in h for h in history):
        return {}
    s = history_summary([{"metrics": h["network_metrics"]} for h in history])
    return {"network": {"avg_2_to_T": s["avg_incremental_2_to_T"], "avg_1_to_T": s["avg_incremental_1_to_T"],
                        "last": s["last"], "accuracy": [h["network_metrics"]["overall"] for h in history]}}


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


def describe(plan: BenchPlan, kind: str) -> list[str]:
    """What the grid will run, said before it starts: epochs per step of each row, rho, class order."""
    from sbcli.methods import build_config
    from sbcli.run.plan import sequence_epochs

    lines = [f"Bench on {plan.seq.source or 'demo'} ({kind}): class order {class_order_text(plan.seq.order_seed)}, "
             f"{plan.run.train.epochs} epochs a phase, {ran_text(plan)}."]
    for name in plan.methods:
        parts = []
        for tasks in plan.task_counts:
            seq, run = cell_options(plan, Cell(name, tasks), kind)
            options = dataclasses.asdict(build_config(run.method, run.method_options))
            epochs = sequence_epochs(run.method, options, run.train.epochs, [1] * tasks)
            rho = f", rho {options['rho']:g}" if "rho" in options else ""
            if "rho" in options and plan.rho is None and tasks not in PAPER_RHO.get(kind, {}):
                rho += " (the paper gives none here; --rho sets it)"
            parts.append(f"T{tasks}: {epochs_text(epochs)}{rho}")
        lines.append(f"  {name}: epochs per step " + "; ".join(parts))
    return lines


def write_outputs(table: dict, out: Path, plots: bool) -> tuple[list[Path], list[str]]:
    """table.md, table.json and (when asked and possible) the two figures; notes say what was left out."""
    from sbcli.run import plots as figures

    out = Path(out)
    files = [out / "table.md", out / "table.json"]
    files[0].write_text(table_markdown(table), encoding="utf-8")
    files[1].write_text(json.dumps(strict(table), indent=2) + "\n", encoding="utf-8")
    notes = []
    if plots and not figures.available():
        notes.append('Figures skipped: matplotlib is not installed (pip install "sbcli[plots]").')
    elif plots:
        files.append(figures.accuracy_per_step(table, out / "accuracy_per_step.png"))
        files.append(figures.intra_old_new(table, out / "intra_old_new.png"))
    return files, notes
