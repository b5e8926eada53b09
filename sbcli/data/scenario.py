"""Class orders and task splits: pure, seeded data (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sbcli.errors import ConfigError


def class_order(num_classes: int, seed: int | None) -> list[int]:
    """A permutation of ``range(num_classes)`` from ``numpy.random.RandomState(seed).shuffle``.

    Seed 0 is the order of the Split-and-Bridge code, seed 1993 the iCaRL/PyCIL order; ``None``
    keeps the dataset's own order.
    """
    order = np.arange(num_classes)
    if seed is not None:
        np.random.RandomState(seed).shuffle(order)
    return [int(c) for c in order]


def task_sizes(num_classes: int, tasks: int | None = None, base: int | None = None, increment: int | None = None) -> list[int]:
    """Task sizes: ``tasks`` equal tasks, or a ``base`` task plus tasks of ``increment`` classes.

    Raises:
        ConfigError: when the classes do not divide as asked.
    """
    if base is None:
        tasks = 1 if tasks is None else tasks
        if tasks < 1:
            raise ConfigError(f"--tasks {tasks} is not a number of tasks; give 1 or more.")
        if num_classes % tasks:
            raise ConfigError(f"--tasks {tasks} does not divide the {num_classes} classes; pick a divisor of {num_classes}.")
        return [num_classes // tasks] * tasks
    increment = base if increment is None else increment
    rest = num_classes - base
    if base < 1 or base > num_classes or increment < 1 or rest % increment:
        raise ConfigError(
            f"A base task of {base} plus tasks of {increment} does not cover {num_classes} classes; "
            "choose sizes with base + k * increment = number of classes."
        )
    return [base] + [increment] * (rest // increment)


@dataclass(frozen=True)
class Scenario:
    """A class order and the task sizes that cut it; ``tasks[t]`` lists dataset class ids."""

    order: list[int]
    sizes: list[int]

    @property
    def tasks(self) -> list[list[int]]:
        bounds = np.cumsum([0, *self.sizes])
        return [self.order[bounds[t] : bounds[t + 1]] for t in range(len(self.sizes))]

    def to_json(self) -> dict:
        return {"order": list(self.order), "sizes": list(self.sizes)}


def make_scenario(num_classes: int, seed: int | None, tasks: int | None = None, base: int | None = None,
                  increment: int | None = None, order: list[int] | None = None) -> Scenario:
    """The scenario of a benchmark run: a seeded (or given) class order cut into tasks."""
    if order is not None:
        if sorted(order) != list(range(num_classes)):
            raise ConfigError(f"--class-order must be a permutation of 0..{num_classes - 1}.")
    else:
        order = class_order(num_classes, seed)
    return Scenario(order=list(order), sizes=task_sizes(num_classes, tasks, base, increment))
