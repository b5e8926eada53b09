"""`sb forget`: a new step of a learner without some of its classes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from sbcli.cli import paths
from sbcli.cli._errors import friendly_errors
from sbcli.cli._options import DeviceOpt, JsonOpt, KeepOpt, LearnerArg, QuietOpt
from sbcli.cli.console import plain

EPILOG = """Examples:

  sb forget my-learner alice bob --data photos/train   # exact: their training images leave the head's sums

  sb forget my-learner alice                           # the head alone: alice's images stay in its sums

  sb rollback my-learner 4                             # undone, like any step (step 4: the one before)
"""


@friendly_errors
def forget(
    learner: LearnerArg,
    classes: Annotated[list[str], typer.Argument(help="The classes to take out, by name.", show_default=False)],
    data: Annotated[Optional[Path], typer.Option("--data", help="The training images of those classes (one folder per class): the learner then becomes, to float64's rounding, one never taught them. Without it the classes leave the head alone.", show_default=False)] = None,
    keep: KeepOpt = None,
    device: DeviceOpt = "auto",
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Take classes out of a learner as a new step (exactly for --method ranpac with --data, and simplecil)."""
    paths.learner(learner)  # before torch loads: a mistyped path answers at once
    from sbcli import api
    from sbcli.cli import render

    step = api.forget(learner, classes, data, device=device, keep=keep)
    exact = api.ForgetRecord.from_json(step.state.history[-1].record).exact if step.state is not None else False

    def show() -> None:
        if not quiet:
            for note in step.notes:
                render.ERR.print(plain(note), highlight=False, soft_wrap=True)
        how = ("exactly" if exact else "from the head alone (see the note above)")
        render.OUT.print(f"Learner {plain(learner)} took out {', '.join(plain(c) for c in step.state.history[-1].forgotten)} "
                         f"{how} at step {step.step}; it now knows {step.num_classes} classes, "
                         f"{render.fmt(step.metrics.overall)} % right on their test images.", highlight=False,
                         soft_wrap=True)

    render.Output(json_out).result({"step": step.step, "classes": step.num_classes, "forgotten":
                                    step.state.history[-1].forgotten, "exact": exact,
                                    "metrics": step.metrics.to_json(), "notes": step.notes}, show)
