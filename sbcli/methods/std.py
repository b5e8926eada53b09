"""STD: the standard KD baseline, lambda * KD + (1 - lambda) * CE, teacher = model t-1.

Inference variants (docs/method.md §10): ``wa`` (default; head bias held at zero, weight aligning
after each step), ``bic`` (a bias layer fit on held-out data, :mod:`sbcli.methods.bic_training`), ``icarl``
(training loss CE + KD unweighted, nearest mean of exemplars at inference,
:mod:`sbcli.methods.rules.class_means`) and ``none`` (the plain head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from sbcli.errors import ConfigError
from sbcli.methods.base import (MethodConfig, TaskContext, TaskResult, inference_option, option, register_method,
                               rule_option)
from sbcli.methods.rules import RULES, bic, icarl, wa

if TYPE_CHECKING:
    import torch

    from sbcli.engine.loop import Phase, StepOutputs


@dataclass(frozen=True)
class Config(MethodConfig):
    RULES: ClassVar[tuple[str, ...]] = ("wa", "none", "bic", "icarl")
    inference: str = inference_option("wa")
    bic_val_fraction: float = rule_option(bic.VAL_FRACTION)
    wa_clip: bool = rule_option(wa.CLIP)
    nme_flips: bool = rule_option(icarl.FLIPS)


def icarl_loss(out: StepOutputs) -> torch.Tensor:
    """iCaRL's training loss as the paper's baseline uses it: CE + KD(old logits), unweighted."""
    from sbcli.methods.losses import ce_loss, kd_loss

    num_old = out.teacher_logits.shape[1]
    return kd_loss(out.logits[:, :num_old], out.teacher_logits) + ce_loss(out.logits, out.targets)


@register_method("std", Config, "lambda*KD + (1-lambda)*CE, with WA (default), BiC, iCaRL (NME) or no inference rule",
                 title="STD: lambda * KD + (1 - lambda) * CE (the standard knowledge-distillation baseline)",
                 any_backbone=True)
def learn_task(ctx: TaskContext, cfg: Config) -> TaskResult:
    from sbcli.methods.first_task import learn_first_task

    if ctx.step == 0:
        if RULES.get(cfg.inference).needs_memory and ctx.memory_budget < ctx.num_total:
            raise ConfigError(f"--inference {cfg.inference} needs exemplars of every class; give --memory of at least "
                              "a few images per class.")
        return learn_first_task(ctx, cfg.first_task_rules)
    return STEPS[cfg.inference](ctx, cfg)


def _learn_bic(ctx: TaskContext, cfg: Config) -> TaskResult:
    from sbcli.methods.bic_training import BiasTraining, learn_bic_step

    return learn_bic_step(ctx, BiasTraining(val_fraction=cfg.bic_val_fraction))


def _learn_icarl(ctx: TaskContext, cfg: Config) -> TaskResult:
    """CE + KD; the class means that score at inference are refreshed after the memory update."""
    from sbcli.engine.loop import Phase

    phase = Phase("std", icarl_loss, ctx.epochs, teacher=ctx.teacher)
    return TaskResult(phases=[ctx.engine.run(ctx.model, ctx.data, phase)])


def _learn_std(ctx: TaskContext, cfg: Config) -> TaskResult:
    """The STD loss; with ``wa`` the head bias stays zero and the new rows are aligned afterwards."""
    from sbcli.engine.loop import Phase
    from sbcli.methods.losses import kd_ce

    phase = Phase("std", kd_ce(ctx.num_old, ctx.lam), ctx.epochs, teacher=ctx.teacher)
    return run_aligned(ctx, phase, cfg)


def run_aligned(ctx: TaskContext, phase: Phase, cfg: Config) -> TaskResult:
    """Run ``phase`` on the task; under a rule that aligns, trained as it asks (:func:`wa.aligned_phase`,
    ``--wa-clip``); the align stage itself ends the step in the step's tail."""
    if RULES.get(cfg.inference).aligns:
        phase = wa.aligned_phase(ctx.model, phase, clip=cfg.wa_clip)
    return TaskResult(phases=[ctx.engine.run(ctx.model, ctx.data, phase)])


STEPS = {"wa": _learn_std, "none": _learn_std, "bic": _learn_bic, "icarl": _learn_icarl}
