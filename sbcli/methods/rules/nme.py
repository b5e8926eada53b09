"""``nme``: iCaRL's nearest mean of exemplars over class means the method stored (``extra["nme.class_means"]``)."""

from typing import Any

from sbcli.methods.rules.rule import InferenceRule, register_rule

MEANS_KEY = "nme.class_means"  # [C, D]: iCaRL's class means, kept by the method (sbcli.methods.rules.class_means)


def scoring(model: Any, extra: dict) -> Any:
    from sbcli.methods.rules.scoring_modules import nearest_mean_module

    return nearest_mean_module(model, extra, MEANS_KEY)


RULE = register_rule(InferenceRule("nme", "nearest mean of exemplars",
                                   "nearest mean of exemplars (class means inside the exported graph)", scoring=scoring,
                                   offered=False))
