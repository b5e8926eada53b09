"""How many epochs each step of a sequence will train, known before it runs (for ETAs and reports).

An estimate from the method and its options alone, by the method's own ``plan`` (Split-and-Bridge's
later steps run phases A, B and C when the step is split and C alone otherwise; DD trains its
temporary network first; every other method runs one phase of ``--epochs``); with ``--balance-epochs`` every later
step adds that many (over the memory alone, so they are shorter: the ETA is on the safe side). A method that runs another phase than
planned only makes the estimate grow while it runs; what did run is in each step's
``history[].phases``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sbcli.methods import METHODS, build_config

if TYPE_CHECKING:
    from sbcli.learner.state import LearnerState
    from sbcli.watch.watcher import Watcher


def step_epochs(method: str, options: dict | Any, epochs: int, step: int, num_old: int, num_total: int,
                balance: int = 0) -> int:
    """Planned epochs of step ``step`` (0-based) that grows ``num_old`` classes to ``num_total``.

    ``options``: the method's Config, or its options by name.
    """
    spec = METHODS.get(method)
    cfg = options if dataclasses.is_dataclass(options) else build_config(method, options)
    if step == 0:
        return spec.first_plan(cfg, epochs)
    return spec.plan(cfg, epochs, num_old, num_total) + (balance if spec.balances(cfg) else 0)


def sequence_epochs(method: str, options: dict | Any, epochs: int, sizes: Sequence[int], first_step: int = 0,
                    balance: int = 0) -> list[int]:
    """Planned epochs of steps ``first_step..`` of a sequence whose tasks have ``sizes`` classes."""
    return [step_epochs(method, options, epochs, step, sum(sizes[:step]), sum(sizes[: step + 1]), balance)
            for step in range(first_step, len(sizes))]


def announce_plan(watchers: Watcher, state: LearnerState, sizes: Sequence[int]) -> None:
    """Tell the watchers the planned epochs of the steps still to run, by task number (for ETAs), from the
    learner's ``state`` before them and the class counts ``sizes`` of every task, those done included."""
    planned = sequence_epochs(state.method, state.method_config, state.train_config.epochs, sizes, state.steps,
                              state.train_config.balance_epochs)
    watchers.on_plan({state.steps + 1 + i: epochs for i, epochs in enumerate(planned)})

