"""``wa``: weight aligning (Zhao et al., CVPR 2020): the new classes' head rows rescaled to the old ones' norm
at the end of every step, so the scores are the network's own logits (:func:`sbcli.methods.common.weight_align`)."""

from sbcli.methods.rules.rule import InferenceRule, register_rule

RULE = register_rule(InferenceRule("wa", "weight aligning", "weight aligning (folded into the head weights)", aligns=True))
