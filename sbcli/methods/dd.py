"""DD, double distillation (docs/method.md §10; the DMC idea of Zhang et al. 2020).

An incremental step: a temporary network is trained from scratch with plain CE on the new task's
images alone (its own head over the C_new new classes; ``aux_head_rules`` adds step 1's head
rules), then the main network learns with

    lambda * KD(model t-1, old logits) + (1 - lambda) * KD(temporary network, new logits)
    + (1 - lambda) * CE,          lambda = C_old / C_total,

on the new images plus the exemplars, with the head bias held at zero, followed by weight
aligning (DD + WA). The temporary network lives only inside the step: it is neither returned nor
stored in the learner.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sbcli.data.device import DeviceData
from sbcli.engine.loop import Phase, PhaseReport, StepOutputs
from sbcli.errors import ConfigError
from sbcli.methods.losses import ce_loss, kd_loss
from sbcli.methods.base import TaskContext, TaskResult, register_method
from sbcli.methods.common import ce, head_rules_phase, learn_first_task, run_with_wa

INFERENCES = ("wa", "none")


@dataclass(frozen=True)
class Config:
    inference: str = "wa"  # docs/method.md §10: DD + WA
    first_task_rules: bool = True  # authors' code: zero head bias, clip negative head weights in step 1
    aux_epochs: int | None = None  # epochs of the temporary network; None: the run's --epochs
    aux_head_rules: bool = False  # the temporary network trained with plain CE (DMC); True: with step 1's head rules
    wa_clip: bool = False  # WA: clip negative head weights in every step, as WA's authors do (S&B's code: step 1 only)

    def __post_init__(self) -> None:
        if self.inference not in INFERENCES:
            raise ConfigError(f"--inference {self.inference} is not available for dd; choose one of {', '.join(INFERENCES)}.")
        if self.wa_clip and self.inference != "wa":
            raise ConfigError("--wa-clip clips the head during weight-aligned training; it goes with --inference wa.")


class PairTeacher(nn.Module):
    """Both teachers in one forward: [old model's logits | temporary network's logits]."""

    def __init__(self, old: nn.Module, new: nn.Module) -> None:
        super().__init__()
        self.old, self.new = old, new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.old(x), self.new(x)], dim=1)


def double_distillation_loss(num_old: int, lam: float):
    """lambda * KD(old logits) + (1 - lambda) * KD(new logits) + (1 - lambda) * CE."""

    def loss(out: StepOutputs) -> torch.Tensor:
        t = out.teacher_logits
        kd_old = kd_loss(out.logits[:, :num_old], t[:, :num_old])
        kd_new = kd_loss(out.logits[:, num_old:], t[:, num_old:])
        return lam * kd_old + (1 - lam) * kd_new + (1 - lam) * ce_loss(out.logits, out.targets)

    return loss


def new_task_data(data: DeviceData, num_old: int) -> DeviceData:
    """The new classes' images alone, labels shifted to ``range(C_new)``."""
    keep = data.labels >= num_old
    return DeviceData(data.images[keep], data.labels[keep] - num_old)


def train_temporary_network(ctx: TaskContext, epochs: int, head_rules: bool = False) -> tuple[nn.Module, PhaseReport]:
    """A fresh network trained with CE on the new task alone, returned frozen in eval mode.

    With ``head_rules`` it is trained like step 1 of the authors' code: head bias at zero,
    negative head weights clipped.

    Raises:
        ConfigError: the run gives no way to build a second network.
    """
    if ctx.make_aux_model is None:
        raise ConfigError("--method dd needs a temporary network, which this run cannot build; use `sb train`.")
    aux = ctx.make_aux_model(ctx.num_total - ctx.num_old)
    phase = head_rules_phase(aux, Phase("dd-new", ce, epochs), head_rules)
    report = ctx.engine.run(aux, new_task_data(ctx.data, ctx.num_old), phase)
    aux.eval()
    for p in aux.parameters():
        p.requires_grad_(False)
    return aux, report


@register_method("dd", Config, "double distillation: a temporary new-task network as a second teacher, then WA")
def learn_task(ctx: TaskContext, cfg: Config) -> TaskResult:
    if ctx.step == 0:
        return learn_first_task(ctx, cfg.first_task_rules)
    epochs = ctx.epochs if cfg.aux_epochs is None else cfg.aux_epochs
    aux, aux_report = train_temporary_network(ctx, epochs, cfg.aux_head_rules)
    teacher = PairTeacher(ctx.teacher, aux).eval()
    phase = Phase("dd", double_distillation_loss(ctx.num_old, ctx.lam), ctx.epochs, teacher=teacher)
    result = run_with_wa(ctx, phase, cfg.inference == "wa", clip=cfg.wa_clip)
    result.phases.insert(0, aux_report)
    return result
