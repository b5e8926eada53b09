"""The grid of a bench: its rows (methods named as the paper names them), its cells (a method at a
task count, each an ordinary learner directory), and the budget they share.

``<out>/cells/<method>-T<tasks>`` holds a cell; ``<out>/bench.json`` records the budget, and another
budget in the same directory is refused rather than mixed into one table (:func:`check_budget`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sbcli.bench.report import class_order_text, epochs_text, ran_text
from sbcli.defaults import PAPER_ORDER
from sbcli.errors import ConfigError
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
