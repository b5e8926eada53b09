"""Pieces shared by several methods: teachers, the first task and its head rules, the STD loss."""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from sbcli.engine.loop import LossFn, Phase, StepOutputs
from sbcli.methods.base import TaskContext, TaskResult
from sbcli.methods.losses import ce_loss, kd_ce_loss
from sbcli.nets.head import clip_head_weights, zero_head_bias


def frozen_copy(model: nn.Module) -> nn.Module:
    """A frozen teacher: a deep copy in eval mode whose parameters take no gradient."""
    teacher = copy.deepcopy(model).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def ce(out: StepOutputs) -> torch.Tensor:
    """Plain cross-entropy over every seen class."""
    return ce_loss(out.logits, out.targets)


def kd_ce(num_old: int, lam: float) -> LossFn:
    """The STD loss, lambda * KD(the teacher's old logits) + (1 - lambda) * CE, as a phase loss."""

    def loss(out: StepOutputs) -> torch.Tensor:
        return kd_ce_loss(out.logits, out.targets, out.teacher_logits[:, :num_old], lam)

    return loss


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


class PairTeacher(nn.Module):
    """Both teachers of double distillation in one forward: [old model's logits | temporary network's logits]."""

    def __init__(self, old: nn.Module, new: nn.Module) -> None:
        super().__init__()
        self.old, self.new = old, new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.old(x), self.new(x)], dim=1)
