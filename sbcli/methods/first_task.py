"""Step 1 of a method that trains its network: plain CE, with the authors' head rules when asked."""

from __future__ import annotations

import dataclasses

from torch import nn

from sbcli.engine.loop import Phase
from sbcli.methods.base import TaskContext, TaskResult
from sbcli.methods.losses import ce
from sbcli.nets.head import clip_head_weights, zero_head_bias


def head_rules_phase(model: nn.Module, phase: Phase, head_rules: bool) -> Phase:
    """``phase`` with the authors' first-task head rules when asked: bias held at zero, negative weights clipped."""
    if not head_rules:
        return phase
    zero_head_bias(model)
    return dataclasses.replace(phase, after_step=(*phase.after_step, zero_head_bias, clip_head_weights))


def learn_first_task(ctx: TaskContext, head_rules: bool) -> TaskResult:
    """Step 1: plain CE; with ``head_rules`` the head bias stays zero and negative weights are clipped."""
    phase = head_rules_phase(ctx.model, Phase("base", ce, ctx.epochs), head_rules)
    return TaskResult(phases=[ctx.engine.run(ctx.model, ctx.data, phase)])
