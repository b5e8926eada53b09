"""Pieces shared by several methods: head rules, weight aligning, the first task."""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from sbcli.engine.loop import LossFn, Phase, StepOutputs
from sbcli.methods.base import TaskContext, TaskResult
from sbcli.methods.losses import ce_loss, kd_ce_loss
from sbcli.nets.resnet import IncrementalResNet


def frozen_copy(model: nn.Module) -> nn.Module:
    """A frozen teacher: a deep copy in eval mode whose parameters take no gradient."""
    teacher = copy.deepcopy(model).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


@torch.no_grad()
def zero_head_bias(model: nn.Module) -> None:
    """Keep the head bias at zero (phase A, WA training, the first task in the authors' code)."""
    model.head.bias.zero_()


@torch.no_grad()
def clip_head_weights(model: nn.Module) -> None:
    """Clip negative head weights to zero (the authors' code, first task only)."""
    model.head.weight.clamp_(min=0.0)


@torch.no_grad()
def weight_align(model: IncrementalResNet, num_old: int) -> float:
    """WA: scale the new classes' head rows by mean(||old rows||) / mean(||new rows||).

    Biases are not touched. Returns the factor applied.
    """
    norms = model.head.weight.norm(dim=1)
    factor = float(norms[:num_old].mean() / norms[num_old:].mean())
    model.head.weight[num_old:] *= factor
    return factor


def ce(out: StepOutputs) -> torch.Tensor:
    """Plain cross-entropy over every seen class."""
    return ce_loss(out.logits, out.targets)


def kd_ce(num_old: int, lam: float) -> LossFn:
    """The STD loss, lambda * KD(the teacher's old logits) + (1 - lambda) * CE, as a phase loss."""

    def loss(out: StepOutputs) -> torch.Tensor:
        return kd_ce_loss(out.logits, out.targets, out.teacher_logits[:, :num_old], lam)

    return loss


def run_with_wa(ctx: TaskContext, phase: Phase, wa: bool, clip: bool = False) -> TaskResult:
    """Run ``phase`` on the task; with ``wa`` the head bias is held at zero and the new rows aligned after.

    With ``clip`` too, negative head weights are also clipped to zero after every optimiser step
    (WA's authors do; the S&B authors' code clips in step 1 only). The record keeps the accuracy
    before aligning (``before_wa``) and the factor (``wa_factor``).
    """
    if wa:
        zero_head_bias(ctx.model)
        hooks = (zero_head_bias, clip_head_weights) if clip else (zero_head_bias,)
        phase = dataclasses.replace(phase, after_step=(*phase.after_step, *hooks))
    result = TaskResult(phases=[ctx.engine.run(ctx.model, ctx.data, phase)])
    if wa and ctx.align:
        result.record["before_wa"] = ctx.evaluate().to_json()
        result.record["wa_factor"] = weight_align(ctx.model, ctx.num_old)
    return result


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
