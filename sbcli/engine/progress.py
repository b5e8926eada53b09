"""What a run tells whoever watches it: a declared set of callbacks, called by name, never looked up.

:class:`Progress` is the protocol (the events a run emits, as Ultralytics declares its callbacks):

- ``on_plan(plan)``: a sequence starts; the planned epochs of every step still to run, by task number;
- ``on_batch(done, total)``: a batch was launched (a Python call, no device synchronisation);
- ``on_epoch(event)``: an epoch ended (:class:`ProgressEvent`).

:class:`Callbacks` implements every event as a no-op: a watcher subclasses it and overrides what it
shows (the CLI's bars and lines do). A plain function of the event (a notebook's ``print``) is the
same as a ``Callbacks`` whose ``on_epoch`` is that function (:func:`progress_of`). Only the main
process of a distributed run is told anything. No torch here: the CLI imports it at start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


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


class Progress(Protocol):
    """The events of a run, in the order they come."""

    def on_plan(self, plan: dict[int, int]) -> None: ...

    def on_batch(self, done: int, total: int) -> None: ...

    def on_epoch(self, event: ProgressEvent) -> None: ...


class Callbacks:
    """Every event of :class:`Progress`, doing nothing; subclass and override what you show."""

    def on_plan(self, plan: dict[int, int]) -> None:
        return None

    def on_batch(self, done: int, total: int) -> None:
        return None

    def on_epoch(self, event: ProgressEvent) -> None:
        return None

    def __call__(self, event: ProgressEvent) -> None:
        """Callbacks are also a plain epoch function, for callers that pass one."""
        self.on_epoch(event)


@dataclass(frozen=True)
class EpochFunction(Callbacks):
    """A plain function of each epoch's event, as :class:`Progress`."""

    function: Callable[[ProgressEvent], None]

    def on_epoch(self, event: ProgressEvent) -> None:
        self.function(event)


ProgressLike = Progress | Callable[[ProgressEvent], None] | None


def progress_of(watcher: ProgressLike) -> Progress:
    """The :class:`Progress` of what a caller passed: callbacks as they are, a function as its epochs, None as nothing."""
    if watcher is None:
        return Callbacks()
    if isinstance(watcher, Callbacks):
        return watcher
    if all(hasattr(watcher, name) for name in ("on_plan", "on_batch", "on_epoch")):
        return watcher  # implements the protocol without subclassing Callbacks
    return EpochFunction(watcher)
