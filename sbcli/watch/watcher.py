"""What a run tells whoever watches it: a declared set of events, called by name on a list of watchers.

:class:`Watcher` is the protocol, the events of a run in the order they come (as Ultralytics
declares its callbacks):

- ``on_start(start)``: the input is checked and the run is about to learn: what it found and will do
  (``sbcli.run.banner.RunBanner``: the data, the network, the epochs, the settings it runs with and
  the epochs the learner trained before);
- ``on_plan(plan)``: the planned epochs of every step still to run, by task number (for ETAs);
- ``on_batch(done, total)``: a batch was launched (a Python call, no device synchronisation);
- ``on_epoch(event)``: an epoch ended (:class:`ProgressEvent`);
- ``on_phase(report)``: a phase ended (``sbcli.engine.loop.PhaseReport``);
- ``on_step(summary)``: a step ended and was saved (``sbcli.run.steps.StepSummary``);
- ``on_end()``: the run ended, done or failed (a log closes here).

A run calls :class:`Watchers`, a list that tells each of its watchers every event in turn (as
Ultralytics appends its integrations' callbacks), and ``on_end`` when the run's ``with`` block is left: the CLI composes its terminal reporter with the
experiment logs of ``--log`` (:mod:`sbcli.watch.logs`). :class:`Callbacks` implements every event as a
no-op: a watcher subclasses it and overrides what it shows. A plain function of the event (a
notebook's ``print``) watches the epochs alone (:func:`watchers_of`). Only the main process of a
distributed run is told anything. No torch here: the CLI builds its watchers before torch loads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ProgressEvent:
    """Emitted after every epoch, for the CLI to render."""

    task: int
    phase: str
    epoch: int
    epochs: int
    loss: float
    images_per_s: float
    precision: str = "fp32"  # what the steps compute in: "bf16" (autocast) or "fp32"
    lr: float = float("nan")  # the learning rate the epoch's steps used (the last step's, with a per-step schedule)


@runtime_checkable
class Watcher(Protocol):
    """The events of a run, in the order they come (see the module docstring)."""

    def on_start(self, start: Any) -> None: ...

    def on_plan(self, plan: dict[int, int]) -> None: ...

    def on_batch(self, done: int, total: int) -> None: ...

    def on_epoch(self, event: ProgressEvent) -> None: ...

    def on_phase(self, report: Any) -> None: ...

    def on_step(self, summary: Any) -> None: ...

    def on_end(self) -> None: ...


class Callbacks:
    """Every event of :class:`Watcher`, doing nothing; subclass and override what you show."""

    def on_start(self, start: Any) -> None:
        return None

    def on_plan(self, plan: dict[int, int]) -> None:
        return None

    def on_batch(self, done: int, total: int) -> None:
        return None

    def on_epoch(self, event: ProgressEvent) -> None:
        return None

    def on_phase(self, report: Any) -> None:
        return None

    def on_step(self, summary: Any) -> None:
        return None

    def on_end(self) -> None:
        return None

    def __call__(self, event: ProgressEvent) -> None:
        """Callbacks are also a plain epoch function, for callers that pass one."""
        self.on_epoch(event)


@dataclass(frozen=True)
class EpochFunction(Callbacks):
    """A plain function of each epoch's event, as a :class:`Watcher`."""

    function: Callable[[ProgressEvent], None]

    def on_epoch(self, event: ProgressEvent) -> None:
        self.function(event)


class Watchers(Callbacks):
    """A list of watchers, each told every event in the list's order; as a context, told ``on_end`` at its exit."""

    def __init__(self, watchers: Iterable[Watcher] = ()) -> None:
        self.watchers = list(watchers)

    def __enter__(self) -> Watchers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.on_end()

    def on_start(self, start: Any) -> None:
        for w in self.watchers:
            w.on_start(start)

    def on_plan(self, plan: dict[int, int]) -> None:
        for w in self.watchers:
            w.on_plan(plan)

    def on_batch(self, done: int, total: int) -> None:
        for w in self.watchers:
            w.on_batch(done, total)

    def on_epoch(self, event: ProgressEvent) -> None:
        for w in self.watchers:
            w.on_epoch(event)

    def on_phase(self, report: Any) -> None:
        for w in self.watchers:
            w.on_phase(report)

    def on_step(self, summary: Any) -> None:
        for w in self.watchers:
            w.on_step(summary)

    def on_end(self) -> None:
        for w in self.watchers:
            w.on_end()


WatcherLike = Watcher | Callable[[ProgressEvent], None] | Iterable[Watcher | Callable[[ProgressEvent], None]] | None


def watchers_of(given: WatcherLike) -> Watchers:
    """The :class:`Watchers` of what a caller passed: a watcher, a function of each epoch's event, a list of
    either, or None (nobody watches).

    Raises:
        TypeError: something that is neither a watcher nor a function.
    """
    if isinstance(given, Watchers):
        return given
    if given is None:
        return Watchers()
    if isinstance(given, (list, tuple)):
        return Watchers(_one(w) for w in given)
    return Watchers([_one(given)])


def _one(given: Any) -> Watcher:
    if isinstance(given, Watcher):  # every event declared (a Callbacks subclass, or a class of its own)
        return given
    if callable(given):
        return EpochFunction(given)
    raise TypeError(f"{type(given).__name__} is not a watcher: give an object with the events of "
                    "sbcli.watch.watcher.Watcher, or a function of each epoch's event.")
