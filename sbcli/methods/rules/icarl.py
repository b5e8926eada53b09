"""``icarl``: STD's training with iCaRL's loss, scored by the nearest mean of exemplars; the class means are
rebuilt from the exemplars after every memory update (:func:`sbcli.methods.rules.class_means.refresh_means`)."""

from typing import Any

from sbcli.methods.rules.nme import scoring
from sbcli.methods.rules.rule import InferenceRule, RuleOption, register_rule

FLIPS = RuleOption("nme_flips", True, "With --inference icarl: class means over the exemplars and their flips "
                                      "(on: iCaRL's code; off: PyCIL).")


def refresh(*args: Any) -> dict:
    from sbcli.methods.rules.class_means import refresh_means

    return refresh_means(*args)


RULE = register_rule(InferenceRule(
    "icarl", "nearest mean of exemplars", "iCaRL's nearest mean of exemplars (class means inside the exported graph)",
    clamps_first_task=False, needs_memory=True, scoring=scoring, refresh=refresh, options=(FLIPS,)))
