"""`sb add-task`: learn a new class set with the learner's own method."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from sbcli.cli import paths
from sbcli.cli._errors import friendly_errors
from sbcli.cli._options import (
    BalanceEpochsOpt,
    DeviceOpt,
    EpochsOpt,
    JsonOpt,
    KeepOpt,
    LearnerArg,
    LogOpt,
    NameOpt,
    NoTestSampleOpt,
    QuietOpt,
    TestOpt,
    TestRootsOpt,
    WarmupOpt,
)
from sbcli.cli.console import plain

EPILOG = """Examples:

  sb add-task my-learner ./new-classes/train --test ./new-classes/val

  sb add-task pulled ./new/train --test ./new/val --no-rehearsal    # a learner pulled without its memory

A step uses the method and settings the learner records (a folder's default: STD + WA with the head's
negative weights clipped in every step, which kept 57 % of the old classes at step 2 instead of 25 %
on 20 Tiny-ImageNet classes); --epochs, --warmup-epochs and --balance-epochs change them from here on.

A learner of --method ranpac or simplecil (a frozen backbone) trains nothing: one pass of the backbone over the new images (the old test images' features are cached) and one solve. Measured on a quiet 2-core CPU (medians; docs/lab/benchmarks.md, "Add-task time, side by side" and "Add-task time at 224 px"): `sb add-task ridge-learner tasks/task10/train --test tasks/task10/test --device cpu`, a 10th task of 5 Tiny-ImageNet-100 classes (1,000 training and 250 test images at 32 px) on a ResNet-18 x0.25 backbone, took 4.25 s with the ridge head and 49.7 s with S&B + WA at 30 epochs; `python benchmarks/add_task_speed.py --per-class 50 --test-per-class 20`, 2 CIFAR-10 classes (100 training and 40 test images at 224 px) on a full-width ResNet-18, 7.2 s and 270.6 s.
"""


@friendly_errors
def add_task(
    learner: LearnerArg,
    folder: Annotated[Path, typer.Argument(help="Class-per-folder training images of the new classes.", show_default=False)],
    test: TestOpt = None,
    dataset_name: NameOpt = None,
    method: Annotated[Optional[str], typer.Option("--method", help="Check that the learner uses this method (a learner keeps the method it was started with).", show_default=False)] = None,
    epochs: EpochsOpt = None,
    data_roots: TestRootsOpt = None,
    no_test_sample: NoTestSampleOpt = False,
    no_rehearsal: Annotated[bool, typer.Option("--no-rehearsal", help="Grow a learner that holds no exemplars of its classes (pushed without --with-memory) by distillation alone.")] = False,
    keep: KeepOpt = None,
    warmup_epochs: WarmupOpt = None,
    balance_epochs: BalanceEpochsOpt = None,
    device: DeviceOpt = "auto",
    log: LogOpt = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Add a new class set to a learner (the learner is rewritten only when the step is done)."""
    paths.learner(learner)  # before torch loads: a mistyped path answers at once
    paths.folder(folder)
    if test is not None:
        paths.folder(test, "test folder")
    from sbcli import api
    from sbcli.cli import progress, render
    from sbcli.cli.training import closing_line, keeping_hint
    from sbcli.metrics import history_summary
    from sbcli.watch.logs import check_kinds, log_watchers

    main = api.is_main_process()  # under torchrun, rank 0 alone prints and logs
    check_kinds(log or [])
    reporter = progress.reporter(quiet or not main, every=None)  # a tenth of the step's epochs, from its start
    watchers = [reporter, *(log_watchers(log, learner) if main and log else [])]  # each told every event of the run
    with api.session(device), reporter:
        reporter.note(f"Adding the images of {plain(folder)} to {plain(learner)}")
        options = api.AddTaskOptions(epochs=epochs, method=method, warmup_epochs=warmup_epochs,
                                     data_roots=list(data_roots or []),
                                     test_sample=not no_test_sample, no_rehearsal=no_rehearsal,
                                     balance_epochs=balance_epochs, name=dataset_name)
        step = api.add_task(learner, folder, test, device=device, keep=keep, options=options, on_progress=watchers)
        for note in step.notes:
            reporter.note(note)
    if not main:
        return
    after = step.state  # the learner as the step saved it: the CLI renders what the API answers, and reads nothing
    history = after.history if after is not None else []
    result = history_summary(history) if history else None

    def show() -> None:
        if result is not None:  # a step saved: its history and summary
            line, hint = closing_line(history), keeping_hint(history, after.memory, after.provenance, after.tasks)
            for table in render.closing_tables(history, result):
                render.OUT.print(table)
            render.OUT.print(line, highlight=False, soft_wrap=True)
            if hint:
                render.OUT.print(hint, highlight=False, soft_wrap=True)
        render.OUT.print(f"Learner {plain(learner)} now knows {step.num_classes} classes (history.csv{render.png_note(learner)} updated).")

    render.Output(json_out).result({"step": step.step, "classes": step.num_classes, "metrics": step.metrics.to_json(),
                                    "history": [h.to_json() for h in history],
                                    "summary": {} if result is None else result.to_json(), "notes": step.notes},
                                   show)
