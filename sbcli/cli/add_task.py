"""`sb add-task`: learn a new class set with the learner's own method."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from sbcli.cli._errors import friendly_errors
from sbcli.cli._options import (
    DeviceOpt,
    EpochsOpt,
    JsonOpt,
    KeepOpt,
    LearnerArg,
    NoTestSampleOpt,
    TestOpt,
    TestRootsOpt,
    WarmupOpt,
)

EPILOG = """Examples:

  sb add-task my-learner ./new-classes/train --test ./new-classes/val

  sb add-task pulled ./new/train --test ./new/val --no-rehearsal    # a learner pulled without its memory
"""


@friendly_errors
def add_task(
    learner: LearnerArg,
    folder: Annotated[Path, typer.Argument(help="Class-per-folder training images of the new classes.", show_default=False)],
    test: TestOpt = None,
    method: Annotated[Optional[str], typer.Option("--method", help="Check that the learner uses this method (a learner keeps the method it was started with).", show_default=False)] = None,
    epochs: EpochsOpt = None,
    data_roots: TestRootsOpt = None,
    no_test_sample: NoTestSampleOpt = False,
    no_rehearsal: Annotated[bool, typer.Option("--no-rehearsal", help="Grow a learner that holds no exemplars of its classes (pushed without --with-memory) by distillation alone.")] = False,
    keep: KeepOpt = None,
    warmup_epochs: WarmupOpt = None,
    device: DeviceOpt = "auto",
    json_out: JsonOpt = False,
) -> None:
    """Add a new class set to a learner (the learner is rewritten only when the step is done)."""
    from sbcli import api, distributed
    from sbcli.cli import render
    from sbcli.learner import read_state

    main = distributed.is_main_process()  # under torchrun, rank 0 alone prints
    if main:
        render.ERR.print(f"Adding the classes of {folder} to {learner}", highlight=False)
    with distributed.session(device):
        options = api.AddTaskOptions(epochs=epochs, method=method, data_roots=list(data_roots or []),
                                     test_sample=not no_test_sample, no_rehearsal=no_rehearsal)
        step = api.add_task(learner, folder, test, device=device, keep=keep, options=options,
                            warmup_epochs=warmup_epochs,
                            on_progress=render.ProgressPrinter(5))
    if not main:
        return
    render.step_line(step)
    for note in step.notes:
        render.ERR.print(note, highlight=False, soft_wrap=True)
    history = read_state(learner).history
    if json_out:
        render.print_json({"step": step.step, "classes": step.num_classes, "metrics": step.metrics.to_json(),
                           "history": history, "notes": step.notes})
        return
    render.OUT.print(render.history_table(history))
    ablation = render.ablation_table(history)
    if ablation is not None:
        render.OUT.print(ablation)
