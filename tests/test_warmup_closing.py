"""The closing line of `sb train`: what the last step's numbers mean (chance, old against new)."""

from __future__ import annotations

import math

from sbcli.cli.runs import closing_line


def step(num_classes: int, overall: float, old: float, new: float) -> dict:
    return {"num_classes": num_classes, "metrics": {"overall": overall, "old": old, "new": new, "per_task": []}}


def test_it_names_chance_and_old_against_new_classes():
    line = closing_line([step(2, 96.0, math.nan, 96.0), step(8, 70.0, 65.0, 90.0), step(10, 62.25, 58.1, 78.0)])
    assert "62.2 %" in line or "62.3 %" in line
    assert "all 10 classes" in line and "chance 10.0 %" in line
    assert "58.1 % on the 8 old classes" in line and "78.0 % on the 2 new ones" in line
    assert "\n" not in line


def test_one_step_has_no_old_classes():
    line = closing_line([step(5, 84.4, math.nan, 84.4)])
    assert line.endswith("(chance 20.0 %).") and "old" not in line
