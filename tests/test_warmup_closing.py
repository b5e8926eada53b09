"""The closing line of `sb train`: what the last step's numbers mean (chance, old against new)."""

from __future__ import annotations

import math

from sbcli.cli.training import closing_line
from sbcli.learner.records import MemorySettings, Provenance, StepRecord
from sbcli.metrics import StepMetrics


def step(num_classes: int, overall: float, old: float, new: float) -> StepRecord:
    return StepRecord(1, num_classes, StepMetrics(overall, [], old, new, math.nan, math.nan))


def test_it_names_chance_and_old_against_new_classes():
    line = closing_line([step(2, 96.0, math.nan, 96.0), step(8, 70.0, 65.0, 90.0), step(10, 62.25, 58.1, 78.0)])
    assert "62.2 %" in line or "62.3 %" in line
    assert "all 10 classes" in line and "chance 10.0 %" in line
    assert "58.1 % on the 8 old classes" in line and "78.0 % on the 2 new ones" in line
    assert "\n" not in line


def test_one_step_has_no_old_classes():
    line = closing_line([step(5, 84.4, math.nan, 84.4)])
    assert line.endswith("(chance 20.0 %).") and "old" not in line


def test_a_hint_follows_when_the_old_classes_kept_under_half_of_the_new_ones():
    from sbcli.cli.training import keeping_hint

    forgot = [step(5, 50.0, math.nan, 50.0), step(50, 6.7, 0.9, 59.2)]
    hint = keeping_hint(forgot, MemorySettings(500), Provenance())
    assert hint is not None and "--memory 500" in hint and "10 exemplars a class" in hint and "--pretrained" in hint
    assert "--pretrained" not in keeping_hint(forgot, MemorySettings(500), Provenance(pretrained={"repo": "a/b"}))
    kept = [step(2, 96.0, math.nan, 96.0), step(10, 62.25, 58.1, 78.0)]
    assert keeping_hint(kept, MemorySettings(200), Provenance()) is None
    assert keeping_hint([step(5, 84.4, math.nan, 84.4)], MemorySettings(200), Provenance()) is None
