"""``ridge``: RanPAC's ridge-regression head on randomly projected features (``--method ranpac``)."""

from typing import Any

from sbcli.methods.rules.rule import InferenceRule, register_rule

PROJECTION_KEY, HEAD_KEY = "ranpac.projection", "ranpac.head"  # [D, M] and [C, M] (sbcli.methods.ranpac)


def scoring(model: Any, extra: dict) -> Any:
    from sbcli.methods.rules.scoring_modules import ridge_module

    return ridge_module(model, extra, HEAD_KEY, PROJECTION_KEY)


RULE = register_rule(InferenceRule(
    "ridge", "a ridge-regression head",
    "a ridge-regression head on randomly projected features (a projection, a ReLU and one linear layer in the "
    "exported graph)",
    balance_refusal=("--balance-epochs does not go with --method ranpac (its backbone stays frozen and its ridge head "
                     "is already the joint solution over every image seen); drop --balance-epochs."),
    scoring=scoring))
