"""``wa``: weight aligning (Zhao et al., CVPR 2020): the new classes' head rows rescaled to the old ones' norm
at the end of every step, so the scores are the network's own logits. The rule's align stage lives here: the
training hooks a weight-aligned phase runs with (:func:`aligned_phase`, asked for by the method that trains it)
and the aligning (:func:`align`, run by the step's tail after the method's phases)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from sbcli.methods.rules.rule import InferenceRule, RuleOption, register_rule
from sbcli.methods.rules.stages import AlignReport

if TYPE_CHECKING:
    from sbcli.metrics import StepMetrics

CLIP = RuleOption("wa_clip", False, "With --inference wa: clip negative head weights in every step, as WA's authors "
                  "(off: step 1 only, as S&B's code). On 20 held-out Tiny-ImageNet classes in 4 tasks it kept 57 % "
                  "of the old classes at step 2 instead of 25 % and raised the average over steps 1..4 from 43.2 "
                  "to 48.7 (two seeds).",
                  refusal="--wa-clip clips the head during weight-aligned training; it goes with --inference wa.")

def weight_align(model: Any, num_old: int) -> float:
    """WA: scale the new classes' head rows by mean(||old rows||) / mean(||new rows||).

    Biases are not touched. Returns the factor applied.
    """
    import torch

    with torch.no_grad():
        norms = model.head.weight.norm(dim=1)
        factor = float(norms[:num_old].mean() / norms[num_old:].mean())
        model.head.weight[num_old:] *= factor
    return factor


def align(model: Any, num_old: int, before: StepMetrics | None = None) -> AlignReport:
    """The align stage: the new rows aligned; its report keeps ``before``, the step's accuracy measured just
    before it (None where the method's record has it, as Split-and-Bridge's ``after_C``)."""
    return AlignReport(weight_align(model, num_old), before)


def aligned_phase(model: Any, phase: Any, clip: bool = False) -> Any:
    """``phase`` as WA trains it: the head bias held at zero (from now and after every optimiser step); with
    ``clip`` negative head weights also clipped to zero after every step (WA's authors do; the S&B authors'
    code clips in step 1 only)."""
    from sbcli.nets.head import clip_head_weights, zero_head_bias

    zero_head_bias(model)
    hooks = (zero_head_bias, clip_head_weights) if clip else (zero_head_bias,)
    return dataclasses.replace(phase, after_step=(*phase.after_step, *hooks))


RULE = register_rule(InferenceRule("wa", "weight aligning", "weight aligning (folded into the head weights)",
                                   align=align, options=(CLIP,)))
