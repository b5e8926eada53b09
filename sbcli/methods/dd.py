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
from typing import TYPE_CHECKING, ClassVar

from sbcli.errors import ConfigError
from sbcli.methods.base import (MethodConfig, TaskContext, TaskResult, inference_option, option, register_method,
                               rule_option)
from sbcli.methods.rules import wa

if TYPE_CHECKING:
    import torch
    from torch import nn

    from sbcli.data.device import DeviceData
    from sbcli.engine.loop import PhaseReport, StepOutputs


@dataclass(frozen=True)
class Config(MethodConfig):
    RULES: ClassVar[tuple[str, ...]] = ("wa", "none")
    inference: str = inference_option("wa")
    aux_epochs: int | None = option(None, "Epochs of the temporary new-task network.", default_text="--epochs")
    aux_head_rules: bool = option(False, "Train the temporary network with step 1's head rules (off: plain CE, "
                                         "as DMC).")
    wa_clip: bool = rule_option(wa.CLIP)


def plan(cfg: Config, epochs: int, num_old: int, num_total: int) -> int:
    """A later step trains the temporary network, then the main one."""
    return (epochs if cfg.aux_epochs is None else cfg.aux_epochs) + epochs


def double_distillation_loss(num_old: int, lam: float):
    """lambda * KD(old logits) + (1 - lambda) * KD(new logits) + (1 - lambda) * CE."""
    from sbcli.methods.losses import ce_loss, kd_loss

    def loss(out: StepOutputs) -> torch.Tensor:
        t = out.teacher_logits
        kd_old = kd_loss(out.logits[:, :num_old], t[:, :num_old])
        kd_new = kd_loss(out.logits[:, num_old:], t[:, num_old:])
        return lam * kd_old + (1 - lam) * kd_new + (1 - lam) * ce_loss(out.logits, out.targets)

    return loss


def new_task_data(data: DeviceData, num_old: int) -> DeviceData:
    """The new classes' images alone, labels shifted to ``range(C_new)``."""
    from sbcli.data.device import DeviceData

    keep = data.labels >= num_old
    return DeviceData(data.images[keep], data.labels[keep] - num_old)


def train_temporary_network(ctx: TaskContext, epochs: int, head_rules: bool = False) -> tuple[nn.Module, PhaseReport]:
    """A fresh network trained with CE on the new task alone, returned frozen in eval mode.

    With ``head_rules`` it is trained like step 1 of the authors' code: head bias at zero,
    negative head weights clipped.

    Raises:
        ConfigError: the run gives no way to build a second network.
    """
    from sbcli.engine.loop import Phase
    from sbcli.methods.first_task import head_rules_phase
    from sbcli.methods.losses import ce

    if ctx.make_aux_model is None:
        raise ConfigError("--method dd needs a temporary network, which this run cannot build; use `sb train`.")
    aux = ctx.make_aux_model(ctx.num_total - ctx.num_old)
    phase = head_rules_phase(aux, Phase("dd-new", ce, epochs), head_rules)
    report = ctx.engine.run(aux, new_task_data(ctx.data, ctx.num_old), phase)
    aux.eval()
    for p in aux.parameters():
        p.requires_grad_(False)
    return aux, report


@register_method("dd", Config, "double distillation: a temporary new-task network as a second teacher, then WA",
                 plan=plan)
def learn_task(ctx: TaskContext, cfg: Config) -> TaskResult:
    from sbcli.engine.loop import Phase
    from sbcli.methods.first_task import learn_first_task
    from sbcli.methods.teachers import PairTeacher
    from sbcli.methods.std import run_aligned

    if ctx.step == 0:
        return learn_first_task(ctx, cfg.first_task_rules)
    epochs = ctx.epochs if cfg.aux_epochs is None else cfg.aux_epochs
    aux, aux_report = train_temporary_network(ctx, epochs, cfg.aux_head_rules)
    teacher = PairTeacher(ctx.teacher, aux).eval()
    phase = Phase("dd", double_distillation_loss(ctx.num_old, ctx.lam), ctx.epochs, teacher=teacher)
    result = run_aligned(ctx, phase, cfg)
    result.phases.insert(0, aux_report)
    return result
