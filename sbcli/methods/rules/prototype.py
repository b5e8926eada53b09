"""``prototype``: SimpleCIL's cosine similarity to class prototypes (``--method simplecil``), one linear layer."""

from typing import Any

from sbcli.methods.rules.rule import InferenceRule, register_rule

PROTOTYPES_KEY = "simplecil.prototypes"  # [C, D]: the class prototypes (sbcli.methods.simplecil)


def scoring(model: Any, extra: dict) -> Any:
    from sbcli.methods.rules.modules import prototype_module

    return prototype_module(model, extra, PROTOTYPES_KEY)


RULE = register_rule(InferenceRule(
    "prototype", "cosine similarity to class prototypes",
    "cosine similarity of the normalised features to class prototypes (one linear layer in the exported graph)",
    balance_refusal=("--balance-epochs does not go with --method simplecil (its backbone stays frozen and its "
                     "prototypes are already class-balanced); drop --balance-epochs."),
    scoring=scoring))
