"""`sb evaluate`: accuracy of a learner over every class seen, per task, old/new, intra-old/new."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from sbcli.cli import paths
from sbcli.cli._errors import friendly_errors
from sbcli.cli._options import DeviceOpt, JsonOpt, LearnerArg, StepOpt, TestRootsOpt
from sbcli.cli.console import plain

EPILOG = """Examples:

  sb evaluate my-learner                  # each task's test folder if here and unchanged, else the carried sample

  sb evaluate my-learner --data-root /data/moved   # the test folders moved: look for them there

  sb evaluate my-learner ./holdout --json # on a class-per-folder directory

  sb evaluate my-learner --step 2         # the learner as it was after step 2 (a kept step)

  sb evaluate my-learner --matrix         # also the step x task accuracy matrix
"""


@friendly_errors
def evaluate(
    learner: LearnerArg,
    folder: Annotated[Optional[Path], typer.Argument(help="Class-per-folder test images (default: the learner's own test sets).", show_default=False)] = None,
    data_roots: TestRootsOpt = None,
    step: StepOpt = None,
    device: DeviceOpt = "auto",
    matrix: Annotated[bool, typer.Option("--matrix", help="Also print the accuracy matrix: after each step (rows), on each task's classes (columns).")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Evaluate a learner now, and show its per-step history and summary."""
    paths.learner(learner)  # before torch loads: a mistyped path answers at once
    if folder is not None:
        paths.folder(folder, "test folder")
    from sbcli import api
    from sbcli.cli import render

    result = api.evaluate(learner, folder, device=device, step=step, data_roots=list(data_roots or []))

    def show() -> None:
        if folder is not None:
            render.ERR.print(f"Test images: the {result.test_images} images of {plain(folder)}.", highlight=False, soft_wrap=True)
        for task in result.test_data.tasks:
            render.ERR.print(f"Test images of task {task.task}: {task.images} from {plain(task.detail)}.",
                             highlight=False, soft_wrap=True)
        m = result.metrics
        table = render.Table(title=f"{plain(result.learner)}: {result.method}, {result.classes} classes, {result.test_images} test images")
        for col in ("accuracy", "old", "new", "intra-old", "intra-new"):
            table.add_column(col, justify="right")
        table.add_row(render.fmt(m.overall), render.fmt(m.old), render.fmt(m.new), render.fmt(m.intra_old),
                      render.fmt(m.intra_new))
        render.OUT.print(table)
        if matrix:
            render.OUT.print(render.matrix_table(result.history, m.per_task))
        for table in render.closing_tables(result.history, result.summary):
            render.OUT.print(table)

    render.Output(json_out).result(result.to_json(), show)
