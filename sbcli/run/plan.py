"""How many epochs each step of a sequence will train, known before it runs (for ETAs and reports).

An estimate from the method and its options alone: Split-and-Bridge's later steps run phases A, B
and C when the step is split (0 < bf < 1) and C alone otherwise; DD trains its temporary network
first; every other method runs one phase of ``--epochs``; with ``--balance-epochs`` every later
step adds that many (over the memory alone, so they are shorter: the ETA is on the safe side). A method that runs another phase than
planned only makes the estimate grow while it runs; what did run is in each step's
``history[].phases``.
"""

from __future__ import annotations

from collections.abc import Sequence

from sbcli.methods.balance import applies
from sbcli.nets.partition import split_fraction


def step_epochs(method: str, options: dict, epochs: int, step: int, num_old: int, num_total: int,
                balance: int = 0) -> int:
    """Planned epochs of step ``step`` (0-based) that grows ``num_old`` classes to ``num_total``."""
    if step == 0:
        return epochs
    return _method_epochs(method, options, epochs, num_old, num_total) + (balance if applies(options.get("inference")) else 0)


def _method_epochs(method: str, options: dict, epochs: int, num_old: int, num_total: int) -> int:
    """The epochs of a later step's own phases."""
    if method == "sb":
        c = _or(options.get("epochs_c"), epochs)
        bf = split_fraction(options.get("rho") or 1.0, num_old, num_total)
        return _or(options.get("epochs_a"), epochs) + _or(options.get("epochs_b"), epochs) + c if 0 < bf < 1 else c
    if method == "dd":
        return _or(options.get("aux_epochs"), epochs) + epochs
    return epochs


def sequence_epochs(method: str, options: dict, epochs: int, sizes: Sequence[int], first_step: int = 0,
                    balance: int = 0) -> list[int]:
    """Planned epochs of steps ``first_step..`` of a sequence whose tasks have ``sizes`` classes."""
    return [step_epochs(method, options, epochs, step, sum(sizes[:step]), sum(sizes[: step + 1]), balance)
            for step in range(first_step, len(sizes))]


def actual_epochs(history: list[dict]) -> list[int]:
    """Epochs each recorded step did train, all its phases together."""
    return [sum(p.get("epochs", 0) for p in h.get("phases", [])) for h in history]


def _or(value: int | None, default: int) -> int:
    return default if value is None else int(value)
