"""`sb bench`: rebuild the paper's comparison (Table 1, Figures 3 to 5) on a dataset and a budget."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from sbcli.cli._errors import friendly_errors
from sbcli.cli._options import (
    DATA,
    METHOD,
    OUT,
    JsonOpt,
    QuietOpt,
    with_run_options,
)
from sbcli.defaults import BENCH_TASKS, PAPER_ORDER, statement

EPILOG = """Examples:

  sb bench                                                    # every method on the demo, 2 and 5 tasks

  sb bench tiny-imagenet --data-root tiny-imagenet-200.zip --out runs/table1   # the paper's budget (GPU days)

  sb bench tiny-imagenet-100.zip --classes 20 --image-size 32 --width 0.25 --epochs 3 \\
      --memory 200 --tasks 2,5 --out runs/bench-cpu                             # a CPU-sized rebuild

Run the same command again to resume: finished cells are skipped.
"""

def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise typer.BadParameter(f"{option} takes whole numbers separated by commas, e.g. 2,5,10.") from None


def build_plan(source: str | None, *, methods: str | None = None, tasks: str | None = None, rho: float | None = None,
               settings: dict[str, Any] | None = None) -> Any:
    """The BenchPlan of the grid's rows (``methods``), columns (``tasks``) and ``rho`` (None: the default), with
    every run's ``settings`` by option name (``image_size``, ``epochs``, ...) through the config layer."""
    from sbcli.bench import BenchPlan
    from sbcli.config.options import bench_defaults, build_options

    defaults = bench_defaults(source)
    seq, run, _ = build_options({**(settings or {}), "source": source}, {k: v for k, v in defaults.items() if k != "tasks"})
    methods = PAPER_ORDER if methods is None else tuple(m.strip() for m in methods.split(",") if m.strip())
    return BenchPlan(methods, _ints(tasks or defaults["tasks"], "--tasks"), seq, run, rho=rho)


@friendly_errors
@with_run_options("bench")
def bench(
    source: Annotated[Optional[str], typer.Argument(help="demo (default), cifar100, tiny-imagenet, a Tiny-ImageNet zip/dir, or a class-per-folder directory.", show_default=False)] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Bench directory: one learner per cell, the table and the figures.", rich_help_panel=OUT)] = Path("runs/bench"),
    methods: Annotated[Optional[str], typer.Option("--methods", help="Rows, comma-separated (default: the paper's seven, " + ",".join(PAPER_ORDER) + "; also std: KD + CE with the plain head).", rich_help_panel=METHOD, show_default=False)] = None,
    tasks: Annotated[Optional[str], typer.Option("--tasks", help=f"Columns: task counts, comma-separated (default: {statement(BENCH_TASKS, 'bench', str)}).", rich_help_panel=DATA, show_default=False)] = None,
    image_size: Annotated[Optional[int], typer.Option("--image-size", help="Training resolution (benchmarks are resized from their own).", rich_help_panel=DATA, show_default=False)] = None,
    test: Annotated[Optional[Path], typer.Option("--test", help="Class-per-folder test images, for a folder source.", rich_help_panel=DATA, show_default=False)] = None,
    rho: Annotated[Optional[float], typer.Option("--rho", help="S&B's rho for every column (default: the paper's value per task count).", rich_help_panel=METHOD, show_default=False)] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Draw the PNG figures (needs matplotlib).", rich_help_panel=OUT)] = True,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
    **run_options: Any,
) -> None:
    """Run a grid of methods x task counts with one budget (resumable); write Table 1 and Figures 3-5."""
    from sbcli.bench import dataset_kind, describe, run_bench
    from sbcli.cli import progress, render

    plan = build_plan(source, methods=methods, tasks=tasks, rho=rho,
                      settings={"image_size": image_size, "test": test, **run_options})
    reporter = progress.reporter(quiet, every=max(1, plan.run.train.epochs // 5))

    def on_cell(cell, index, count, action):
        title = f"cell {index}/{count}: {cell.method}, {cell.tasks} tasks"
        reporter.set_title(title)
        reporter.note(f"{title} · {action}")

    with reporter:
        for line in describe(plan, dataset_kind(plan)):
            reporter.note(line)
        result = run_bench(plan, out, plots=plots, on_cell=on_cell, on_progress=reporter)
        for note in result.notes:
            reporter.note(note)

    def show() -> None:
        render.OUT.print((out / "table.md").read_text(encoding="utf-8"), markup=False, highlight=False, soft_wrap=True)
        render.OUT.print(f"Ran {len(result.ran)} cell(s), skipped {len(result.skipped)} finished; wrote "
                         + ", ".join(str(f) for f in result.files), highlight=False)

    render.Output(json_out).result({**result.table, "files": [str(f) for f in result.files]}, show)
