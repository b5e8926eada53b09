"""`sb train`'s run: the sequence rendered as it goes (the options become configs in :mod:`sbcli.config.options`),
and the closing lines after a step that `sb add-task` shares."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sbcli.cli import render
from sbcli.cli.console import plain

if TYPE_CHECKING:
    from sbcli.api import MemorySettings, Provenance, StepRecord, TaskRecord


def run_training(seq: Any, run: Any, out: Path, *, resume: bool, json_out: bool, quiet: bool = False,
                 log: list[str] | None = None, keep: int | None = None) -> None:
    from sbcli import api
    from sbcli.cli import progress
    from sbcli.metrics import history_summary
    from sbcli.watch.logs import check_kinds, log_watchers

    main = api.is_main_process()  # under torchrun, rank 0 alone prints and logs
    check_kinds(log or [])
    reporter = progress.reporter(quiet or not main, every=max(1, run.train.epochs // 10))
    watchers = [reporter, *(log_watchers(log, out) if main and log else [])]  # each told every event of the run
    with api.session(run.device), reporter:
        reporter.note(f"Training {run.method} on {plain(seq.source or 'demo')} → {plain(out)}")
        learner = api.train(seq, run, out, resume=resume, keep=keep, on_progress=watchers)
    if not main:
        return
    history = learner.state.history
    result = history_summary(history)

    def show() -> None:
        for table in render.closing_tables(history, result):
            render.OUT.print(table)
        render.OUT.print(closing_line(history), highlight=False, soft_wrap=True)
        hint = keeping_hint(history, learner.state.memory, learner.state.provenance, learner.state.tasks)
        if hint:
            render.OUT.print(hint, highlight=False, soft_wrap=True)
        render.OUT.print(f"Learner saved to {plain(out)} (with history.csv{render.png_note(out)}); "
                         f"add classes with `sb add-task {out} FOLDER --test FOLDER`.")

    render.Output(json_out).result({"learner": str(out), "history": [h.to_json() for h in history],
                                    "summary": result.to_json()},
                                   show)


def _pct(value: float, what: str, missing: str) -> str:
    """``90.0 % on WHAT``, or ``MISSING`` in words when there is no number (no test images)."""
    return missing if math.isnan(value) else f"{value:.1f} % {what}"


def closing_line(history: list[StepRecord]) -> str:
    """What the last step's numbers mean, in one line: against chance, and old classes against new ones.

    A number that could not be measured (no test images of those classes) is said in words, never "nan".
    """
    last, seen = history[-1].metrics, history[-1].num_classes
    new = seen - (history[-2].num_classes if len(history) > 1 else 0)
    overall = last.overall
    if math.isnan(overall):
        text = f"After step {len(history)}: no test images, so no accuracy over the {seen} classes seen (give --test)"
    else:
        text = (f"After step {len(history)}: {overall:.1f} % of the test images right over all {seen} classes "
                f"seen (chance {100 / seen:.1f} %)")
    if len(history) == 1 or (math.isnan(last.old) and math.isnan(last.new)):
        return text + "."
    old = _pct(last.old, f"on the {seen - new} old classes (what was kept)", f"no test images of the {seen - new} old classes")
    learned = _pct(last.new, f"on the {new} new ones (what was learned)", f"no test images of the {new} new ones")
    return f"{text}; {old}, {learned}."


def _training_images(tasks: list[TaskRecord]) -> int | None:
    """How many training images the learner's tasks had (None when a task did not record it, e.g. format 1)."""
    counts = [t.data_source.train_counts for t in tasks]
    return None if not counts or any(c is None for c in counts) else sum(sum(c) for c in counts)


def keeping_hint(history: list[StepRecord], memory: MemorySettings, provenance: Provenance,
                 tasks: list[TaskRecord] | None = None) -> str | None:
    """When the old classes kept under half of what the new ones reached, what keeps more (measured:
    docs/lab/benchmarks.md, "Keeping the old classes"): more exemplars a class, a pretrained backbone.

    More exemplars are suggested only when the memory cannot already hold every training image.
    """
    if len(history) < 2:
        return None
    old, new = history[-1].metrics.old, history[-1].metrics.new
    if math.isnan(old) or math.isnan(new) or old >= new / 2:
        return None
    budget, seen = memory.budget, history[-1].num_classes
    images = _training_images(tasks or [])
    pretrained = "" if provenance.pretrained else "a --pretrained backbone"
    where = "(docs/lab/benchmarks.md, \"Keeping the old classes\")"
    if images is not None and budget >= images:
        advice = (f"in sbcli's measurements {pretrained} kept the most {where}" if pretrained
                  else "more training images a class would give it more to keep")
        return (f"The old classes kept less than half of what the new ones reached, though the memory (--memory "
                f"{budget}) holds every training image ({images}); {advice}.")
    also = f" or {pretrained}" if pretrained else ""
    return (f"The old classes kept less than half of what the new ones reached ({budget // seen} exemplars a class "
            f"with --memory {budget}); in sbcli's measurements more exemplars a class{also} kept the most {where}.")
