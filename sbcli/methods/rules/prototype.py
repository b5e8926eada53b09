"""``prototype``: SimpleCIL's scaled cosine similarity to class prototypes (``--method simplecil``), one linear layer."""

from typing import Any

from sbcli.methods.rules.rule import InferenceRule, register_rule

PROTOTYPES_KEY = "simplecil.prototypes"  # [C, D]: the class prototypes (sbcli.methods.simplecil)
SCALE_KEY = "simplecil.scale"  # [1]: the softmax scale of the cosines; learners saved before it have none (scale 1)


def scoring(model: Any, extra: dict) -> Any:
    from sbcli.methods.rules.scoring_modules import prototype_module

    return prototype_module(model, extra, PROTOTYPES_KEY, SCALE_KEY)


RULE = register_rule(InferenceRule(
    "prototype", "cosine similarity to class prototypes",
    "cosine similarity of the normalised features to class prototypes, times a scale fitted for calibrated "
    "probabilities (one linear layer in the exported graph)",
    balance_refusal=("--balance-epochs does not go with --method simplecil (its backbone stays frozen and its "
                     "prototypes are already class-balanced); drop --balance-epochs."),
    scoring=scoring))
