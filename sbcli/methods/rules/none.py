"""``none``: the plain head, the network's own logits."""

from sbcli.methods.rules.rule import InferenceRule, register_rule

RULE = register_rule(InferenceRule("none", "the plain head", "the plain head"))
