"""What ends a step under an inference rule, stage by stage (refresh, align, balance), and the typed report
each stage leaves in the step's record.

A report's ``to_json`` writes exactly the keys ``learner.json`` has always kept for it (``before_balance``;
``before_wa`` and ``wa_factor``), so a learner's bytes do not depend on the reports being typed in memory.
Torch-free at import, like every rule file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sbcli.metrics import StepMetrics

STAGES = ("refresh", "align", "balance")  # the order a step ends in (``--balance-before-wa``: balance, then align)


@dataclass(frozen=True)
class BalanceReport:
    """Class-balanced fine-tuning on the memory: the step's accuracy before it."""

    before: StepMetrics

    def to_json(self) -> dict[str, Any]:
        return {"before_balance": self.before.to_json()}


@dataclass(frozen=True)
class AlignReport:
    """Weight aligning: the factor the new classes' head rows were scaled by, and the accuracy before
    (None where the method records none, as Split-and-Bridge, whose record has its ``after_C``)."""

    factor: float
    before: StepMetrics | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.before is None else {"before_wa": self.before.to_json()}
        out["wa_factor"] = self.factor
        return out


StageReport = BalanceReport | AlignReport


def record_json(record: dict[str, Any], stages: list[StageReport]) -> dict[str, Any]:
    """A step's stored ``record``: the method's own keys, then each stage report's, in the order they ran."""
    out = dict(record)
    for report in stages:
        out.update(report.to_json())
    return out
