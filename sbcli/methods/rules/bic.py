"""``bic``: BiC's bias layer (Wu et al., CVPR 2019), fitted on held-out exemplars and folded into a copy of the head."""

import copy
from typing import Any

from sbcli.errors import LearnerError
from sbcli.methods.rules.rule import InferenceRule, RuleOption, register_rule

SCALE_KEY, SHIFT_KEY = "bic.scale", "bic.shift"  # [C] each: the last step's correction (sbcli.methods.bic_training)
VAL_FRACTION = RuleOption("bic_val_fraction", 0.1, "With --inference bic: share of each class's exemplar quota held "
                                                   "out to fit the bias layer.")


def fold_correction(model: Any, extra: dict) -> Any:
    """A copy of ``model`` whose head includes the bias layer: W_k <- s_k W_k, b_k <- s_k b_k + t_k.

    Without a stored correction (the first step) the copy is the model itself.

    Raises:
        LearnerError: the stored correction does not match the model's classes.
    """
    import torch

    folded = copy.deepcopy(model)
    if SCALE_KEY not in extra:
        return folded
    scale, shift = extra[SCALE_KEY], extra[SHIFT_KEY]
    if scale.shape != (model.num_classes,) or shift.shape != (model.num_classes,):
        raise LearnerError(f"The learner's BiC correction covers {scale.numel()} classes but its network has "
                           f"{model.num_classes}; the learner is corrupt, restore it from a copy.")
    head = folded.head
    with torch.no_grad():
        head.weight.mul_(scale.to(head.weight)[:, None])
        head.bias.mul_(scale.to(head.bias)).add_(shift.to(head.bias))
    return folded


scoring = fold_correction


RULE = register_rule(InferenceRule(
    "bic", "a bias layer", "BiC bias correction (folded into the exported graph)",
    balance_refusal=("--balance-epochs does not go with --inference bic (its bias layer already corrects the new "
                     "classes' bias); drop one of them."),
    clamps_first_task=False, needs_memory=True, scoring=scoring, options=(VAL_FRACTION,)))
