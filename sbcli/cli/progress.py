"""Progress on stderr, three ways: live bars on a terminal, one line per epoch elsewhere, or none.

- ``live`` (stderr is a terminal): rich bars, one per phase (batches of every epoch, loss,
  images/s, precision) under two overall bars, the step and the whole sequence, each with an ETA
  from the epochs already run and the planned epochs still to come (:mod:`sbcli.run.plan`).
- ``lines`` (logs, CI, pipes): one line per epoch (the first, every ``every`` epochs and the last
  of each phase) with the same numbers and both ETAs, and a line per finished step.
- ``quiet`` (``--quiet``): nothing.

A :class:`Reporter` is a watcher of :func:`sbcli.api.train` and friends (:class:`sbcli.watch.watcher.Watcher`):
it shows the run's events; the CLI hands the API a list of it and the experiment logs of ``--log``
(:mod:`sbcli.watch.logs`), each told every event.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn

from sbcli.cli.render import ERR, fmt
from sbcli.watch.watcher import Callbacks


def choose_mode(quiet: bool, console: Console = ERR) -> str:
    """``quiet`` when asked, ``live`` when the console is a terminal, else ``lines``."""
    if quiet:
        return "quiet"
    return "live" if console.is_terminal else "lines"


def reporter(quiet: bool, every: int | None = 1, console: Console = ERR) -> Reporter:
    """The reporter for this terminal: see the module docstring. ``every`` None: a tenth of the run's
    epochs a phase, from its start."""
    mode = choose_mode(quiet, console)
    # The data layer's progress lines (listing, decoding: sbcli.data.progress) follow --quiet too.
    logging.getLogger("sbcli.progress").setLevel(logging.WARNING if mode == "quiet" else logging.NOTSET)
    kind = {"quiet": Reporter, "lines": LineReporter, "live": LiveReporter}[mode]
    return kind(console=console, every=every)


def clock(seconds: float | None) -> str:
    """``1:02:03`` / ``2:03``; ``-:--`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-:--"
    s = round(seconds)
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Timeline:
    """Planned and finished epochs of a sequence, and the ETAs that follow from them.

    The rate is the sequence's elapsed time per finished epoch (evaluation and saving included), so
    the ETA of the step and of the sequence is that rate times the epochs still planned. A step that
    trains more epochs than planned grows its plan as it goes.
    """

    def __init__(self) -> None:
        self.reset({})

    def reset(self, plan: dict[int, int]) -> None:
        self.plan = dict(plan)
        self.done: dict[int, float] = dict.fromkeys(plan, 0.0)
        self.start = time.monotonic()

    def epoch(self, task: int, fraction: float = 1.0) -> None:
        """``fraction`` of an epoch of ``task`` was trained."""
        self.done[task] = self.done.get(task, 0.0) + fraction
        self.plan[task] = max(self.plan.get(task, 0), int(self.done[task] + 0.999))

    def of(self, task: int) -> str:
        """``3/5``: the task number among the sequence's (``3`` when no plan was announced)."""
        return f"{task}/{max(self.plan)}" if self.plan else str(task)

    def totals(self, task: int) -> tuple[float, int, float, int]:
        """(done, planned) epochs of the step, then of the sequence."""
        return self.done.get(task, 0.0), self.plan.get(task, 0), sum(self.done.values()), sum(self.plan.values())

    def eta(self, remaining_epochs: float) -> float | None:
        finished = sum(self.done.values())
        if finished <= 0:
            return None
        return (time.monotonic() - self.start) / finished * max(0.0, remaining_epochs)

    def etas(self, task: int) -> tuple[float | None, float | None]:
        step_done, step_plan, seq_done, seq_plan = self.totals(task)
        return self.eta(step_plan - step_done), self.eta(seq_plan - seq_done)


class Reporter(Callbacks):
    """Says nothing (``--quiet``); the base of the other two."""

    def __init__(self, console: Console = ERR, every: int | None = 1) -> None:
        self.console = console
        self.every = None if every is None else max(1, every)  # None: set from the run's start
        self.timeline = Timeline()
        self.title = "sequence"

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def on_epoch(self, event: Any) -> None:
        """An epoch ended (:class:`sbcli.watch.watcher.ProgressEvent`)."""
        self.show(event)

    def on_step(self, summary: Any) -> None:
        """A step ended and was saved (:class:`sbcli.run.steps.StepSummary`)."""
        self.show_step(summary)

    def show(self, event: Any) -> None:
        self.timeline.epoch(event.task)

    def show_step(self, summary: Any) -> None:
        return None

    def on_plan(self, plan: dict[int, int]) -> None:
        """The planned epochs of every step still to run, by task number (a new sequence starts)."""
        self.timeline.reset(plan)

    def note(self, text: str) -> None:
        """A line for the person watching (what runs, where it writes)."""

    def on_start(self, start: Any) -> None:
        """What the run is about to do (:class:`sbcli.run.banner.RunBanner`): one line, before the first epoch."""
        if self.every is None:
            self.every = max(1, start.epochs // 10)
        self.note(start.text())

    def set_title(self, text: str) -> None:
        """What the whole sequence is called on its bar (a bench names its cell)."""
        self.title = text

    @contextlib.contextmanager
    def status(self, text: str) -> Iterator[None]:
        """A long operation without countable parts (the ONNX parity check)."""
        yield


class LineReporter(Reporter):
    """One line per epoch (the first, every ``every`` and the last of a phase), for logs and CI, and
    within an epoch that runs long a line every :attr:`within_epoch_s` seconds."""

    within_epoch_s = 60.0
    _epoch_started = 0.0
    _last_line = 0.0

    def on_batch(self, done: int, total: int) -> None:
        """A batch of the running epoch was launched: a line when the last one is a minute old."""
        now = time.monotonic()
        if done <= 1:
            self._epoch_started = self._last_line = now
            return
        if now - self._last_line < self.within_epoch_s:
            return
        self._last_line = now
        rate = (done - 1) / max(now - self._epoch_started, 1e-9)
        self._print(f"batch {done:,}/{total:,} of the running epoch · {rate:.1f} batches/s · "
                    f"the epoch ends in {clock((total - done) / rate)}")

    def show(self, event: Any) -> None:
        super().show(event)
        if event.epoch % (self.every or 1) and event.epoch not in (1, event.epochs):  # the first: the rate and ETA, early
            return
        step_eta, seq_eta = self.timeline.etas(event.task)
        self._print(f"{_where(event, self.timeline)} · epoch {event.epoch}/{event.epochs} · loss {event.loss:.4f} · "
                    f"{event.images_per_s:,.0f} img/s · {event.precision} · ETA step {clock(step_eta)}, "
                    f"sequence {clock(seq_eta)}")

    def note(self, text: str) -> None:
        self._print(text)

    def show_step(self, summary: Any) -> None:
        self._print(step_text(summary))

    @contextlib.contextmanager
    def status(self, text: str) -> Iterator[None]:
        self._print(text + " ...")
        yield

    def _print(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)


class LiveReporter(Reporter):
    """rich bars: the sequence, the step, and one per phase of the step (batches, loss, img/s, precision)."""

    def __init__(self, console: Console = ERR, every: int | None = 1) -> None:
        super().__init__(console, every)
        self.bars = Progress(TextColumn("{task.description}"), BarColumn(bar_width=28), TaskProgressColumn(),
                             TextColumn("{task.fields[info]}"), console=console, refresh_per_second=8,
                             redirect_stdout=False)  # stdout holds the results alone
        self.sequence: TaskID | None = None
        self.step_bar: TaskID | None = None
        self.phases: dict[tuple[int, str], TaskID] = {}
        self.current: tuple[int, str] | None = None
        self.epoch_batches = 0.0  # batches of the running epoch already counted in the overall bars
        self.last_batch_update = 0.0

    def __enter__(self) -> LiveReporter:
        self.bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bars.stop()
        super().__exit__(*exc)

    def note(self, text: str) -> None:
        self.bars.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def on_plan(self, plan: dict[int, int]) -> None:
        super().on_plan(plan)
        for bar in (self.sequence, self.step_bar, *self.phases.values()):
            if bar is not None:
                self.bars.remove_task(bar)
        self.phases, self.current, self.step_bar = {}, None, None
        self.sequence = self.bars.add_task(self.title, total=max(1, sum(plan.values())), info="")

    def on_batch(self, done: int, total: int) -> None:
        """A batch of the running epoch was launched (called by the engine; no device sync).

        The bars move at most every 0.1 s (the screen redraws 8 times a second), so a fast GPU loop
        pays a clock read per batch, not a bar update.
        """
        now = time.monotonic()
        if self.current is None or now - self.last_batch_update < 0.1:
            return
        self.last_batch_update = now
        bar = self.phases[self.current]
        task = self.bars.tasks[_index(self.bars, bar)]
        epochs = task.fields["epochs"]
        if task.total != epochs * total:
            self.bars.update(bar, total=epochs * total)
        self.bars.update(bar, completed=task.fields["epoch"] * total + done)
        fraction = done / total - self.epoch_batches
        self.epoch_batches = done / total
        self._advance(self.current[0], fraction)

    def show(self, event: Any) -> None:
        key = (event.task, event.phase)
        if key not in self.phases:
            self._start_phase(key, event.epochs)
        self._advance(event.task, 1.0 - self.epoch_batches)
        self.epoch_batches = 0.0
        bar = self.phases[key]
        total = self.bars.tasks[_index(self.bars, bar)].total
        self.bars.update(bar, description=f"  phase {event.phase} · epoch {min(event.epoch + 1, event.epochs)}/{event.epochs}",
                         epoch=event.epoch, info=f"loss {event.loss:.4f} · {event.images_per_s:,.0f} img/s · {event.precision}",
                         completed=None if total is None else total * event.epoch / event.epochs)
        if event.epoch == event.epochs:
            self.bars.update(bar, description=f"  phase {event.phase} · {event.epochs} epochs")
            self.current = None

    def show_step(self, summary: Any) -> None:
        for key in [k for k in self.phases if k[0] == summary.step]:
            self.bars.remove_task(self.phases.pop(key))
        self.note(step_text(summary))

    @contextlib.contextmanager
    def status(self, text: str) -> Iterator[None]:
        bar = self.bars.add_task(text, total=None, info="")
        try:
            yield
        finally:
            self.bars.remove_task(bar)

    def _start_phase(self, key: tuple[int, str], epochs: int) -> None:
        if self.sequence is None:  # no plan was announced: the overall bars follow what runs
            self.on_plan({})
        if self.step_bar is None or self.bars.tasks[_index(self.bars, self.step_bar)].fields.get("task") != key[0]:
            if self.step_bar is not None:
                self.bars.remove_task(self.step_bar)
            self.step_bar = self.bars.add_task(f" step {self.timeline.of(key[0])}",
                                               total=max(1, self.timeline.plan.get(key[0], epochs)), info="", task=key[0])
        self.phases[key] = self.bars.add_task(f"  phase {key[1]} · epoch 1/{epochs}", total=None, info="",
                                              epochs=epochs, epoch=0)
        self.current = key
        self.epoch_batches = 0.0
        self.last_batch_update = 0.0  # the new bar learns its batch count on the first batch

    def _advance(self, task: int, fraction: float) -> None:
        self.timeline.epoch(task, fraction)
        step_done, step_plan, seq_done, seq_plan = self.timeline.totals(task)
        step_eta, seq_eta = self.timeline.etas(task)
        elapsed = clock(time.monotonic() - self.timeline.start)
        if self.step_bar is not None:
            self.bars.update(self.step_bar, total=step_plan, completed=step_done,
                             info=f"epoch {step_done:.0f}/{step_plan} · ETA {clock(step_eta)}")
        if self.sequence is not None:
            self.bars.update(self.sequence, description=self.title, total=seq_plan, completed=seq_done,
                             info=f"epoch {seq_done:.0f}/{seq_plan} · {elapsed} elapsed · ETA {clock(seq_eta)}")


def _index(bars: Progress, task_id: TaskID) -> int:
    return next(i for i, t in enumerate(bars.tasks) if t.id == task_id)


def _where(event: Any, timeline: Timeline) -> str:
    return f"step {timeline.of(event.task)} · phase {event.phase}"


def step_text(step: Any) -> str:
    """The line that says a step is done and saved."""
    m = step.metrics
    if math.isnan(m.overall):  # no test images: say so rather than "- %"
        return f"step {step.step} done: {step.num_classes} classes, no test images to measure it, in {step.seconds:.1f} s"
    return (f"step {step.step} done: {step.num_classes} classes, accuracy {fmt(m.overall)} % "
            f"(old {fmt(m.old)}, new {fmt(m.new)}) in {step.seconds:.1f} s")
