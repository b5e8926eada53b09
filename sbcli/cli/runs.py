"""Run a `sb train` sequence, rendering as it goes (the options become configs in :mod:`sbcli.config.options`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sbcli.cli import render


def run_training(seq: Any, run: Any, out: Path, *, resume: bool, json_out: bool, quiet: bool = False,
                 log: list[str] | None = None, keep: int | None = None) -> None:
    import dataclasses

    from sbcli import api
    from sbcli.engine import distributed
    from sbcli.run import loggers
    from sbcli.cli import progress
    from sbcli.metrics import history_summary

    main = distributed.is_main_process()  # under torchrun, rank 0 alone prints and logs
    loggers.check_kinds(log or [])
    open_logs = None
    if main and log:
        options = {"sequence": dataclasses.asdict(seq), "run": dataclasses.asdict(run)}
        open_logs = lambda: loggers.open_logs(log, out, options)  # noqa: E731
    reporter = progress.reporter(quiet or not main, every=max(1, run.train.epochs // 10), open_logs=open_logs)
    with distributed.session(run.device), reporter:
        reporter.note(f"Training {run.method} on {seq.source or 'demo'} → {out}")
        learner = api.train(seq, run, out, resume=resume, keep=keep, on_progress=reporter, on_step=reporter.step)
    if not main:
        return
    history = learner.state.history
    result = history_summary(history)

    def show() -> None:
        for table in render.closing_tables(history, result):
            render.OUT.print(table)
        render.OUT.print(closing_line(history), highlight=False, soft_wrap=True)
        hint = keeping_hint(history, learner.state.memory, learner.state.provenance)
        if hint:
            render.OUT.print(hint, highlight=False, soft_wrap=True)
        render.OUT.print(f"Learner saved to {out} (with history.csv{render.png_note(out)}); "
                         f"add classes with `sb add-task {out} FOLDER --test FOLDER`.")

    render.Output(json_out).result({"learner": str(out), "history": history, "summary": result}, show)


def closing_line(history: list[dict]) -> str:
    """What the last step's numbers mean, in one line: against chance, and old classes against new ones."""
    last, seen = history[-1]["metrics"], history[-1]["num_classes"]
    new = seen - (history[-2]["num_classes"] if len(history) > 1 else 0)
    text = (f"After step {len(history)}: {last['overall']:.1f} % of the test images right over all {seen} classes "
            f"seen (chance {100 / seen:.1f} %)")
    if len(history) == 1 or last["old"] != last["old"]:  # one task, or no old-class test images
        return text + "."
    return (f"{text}; {last['old']:.1f} % on the {seen - new} old classes (what was kept), {last['new']:.1f} % "
            f"on the {new} new ones (what was learned).")


def keeping_hint(history: list[dict], memory: dict, provenance: dict) -> str | None:
    """When the old classes kept under half of what the new ones reached, what keeps more (measured:
    docs/benchmarks.md, "Keeping the old classes"): more exemplars a class, a pretrained backbone."""
    last = history[-1]["metrics"] if history else {}
    old, new = last.get("old", float("nan")), last.get("new", float("nan"))
    if len(history) < 2 or old != old or new != new or old >= new / 2:
        return None
    budget, seen = int(memory.get("budget", 0)), history[-1]["num_classes"]
    also = "" if provenance.get("pretrained") else " or a --pretrained backbone"
    return (f"The old classes kept less than half of what the new ones reached ({budget // seen} exemplars a class "
            f"with --memory {budget}); in sbcli's measurements more exemplars a class{also} kept the most "
            "(docs/benchmarks.md, \"Keeping the old classes\").")
