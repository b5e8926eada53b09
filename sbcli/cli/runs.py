"""Run a `sb train` sequence, rendering as it goes (the options become configs in :mod:`sbcli.config`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sbcli.cli import render
from sbcli.config import build_options, merge  # noqa: F401  (their old home; the config layer owns them)


def run_training(seq: Any, run: Any, out: Path, *, resume: bool, json_out: bool, keep: int | None = None) -> None:
    from sbcli import api, distributed
    from sbcli.metrics import history_summary

    every = max(1, run.train.epochs // 10)
    main = distributed.is_main_process()  # under torchrun, rank 0 alone prints
    if main:
        render.ERR.print(f"Training [bold]{run.method}[/] on {seq.source or 'demo'} → {out}", highlight=False)
    with distributed.session(run.device):
        learner = api.train(seq, run, out, resume=resume, keep=keep, on_progress=render.ProgressPrinter(every),
                            on_step=render.step_line)
    if not main:
        return
    history = learner.state.history
    result = history_summary(history)
    if json_out:
        render.print_json({"learner": str(out), "history": history, "summary": result})
        return
    render.OUT.print(render.history_table(history))
    ablation = render.ablation_table(history)
    if ablation is not None:
        render.OUT.print(ablation)
    render.OUT.print(render.summary_table(result))
    render.OUT.print(closing_line(history), highlight=False, soft_wrap=True)
    render.OUT.print(f"Learner saved to {out}; add classes with `sb add-task {out} FOLDER --test FOLDER`.")


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
