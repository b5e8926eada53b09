"""STD: the standard KD baseline, lambda * KD + (1 - lambda) * CE, teacher = model t-1.

Inference variants: ``wa`` (default; head bias held at zero, weight aligning after each step)
and ``none`` (the plain head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sbcli.engine import Phase, StepOutputs
from sbcli.errors import ConfigError
from sbcli.losses import kd_ce_loss
from sbcli.methods.base import TaskContext, TaskResult, register_method
from sbcli.methods.common import learn_first_task, weight_align, zero_head_bias

INFERENCES = ("wa", "none")


@dataclass(frozen=True)
class Config:
    inference: str = "wa"  # spec section 10: STD + WA is the paper's strongest STD variant
    first_task_rules: bool = True  # authors' code: zero head bias, clip negative head weights in step 1

    def __post_init__(self) -> None:
        if self.inference not in INFERENCES:
            raise ConfigError(f"--inference {self.inference} is not available for std; choose one of {', '.join(INFERENCES)}.")


def std_loss(lam: float):
    """lambda * KD(old logits) + (1 - lambda) * CE."""

    def loss(out: StepOutputs) -> torch.Tensor:
        return kd_ce_loss(out.logits, out.targets, out.teacher_logits, lam)

    return loss


@register_method("std", Config, "lambda*KD + (1-lambda)*CE, with WA by default")
def learn_task(ctx: TaskContext, cfg: Config) -> TaskResult:
    if ctx.step == 0:
        return learn_first_task(ctx, cfg.first_task_rules)
    wa = cfg.inference == "wa"
    hooks = (zero_head_bias,) if wa else ()
    if wa:
        zero_head_bias(ctx.model)
    phase = Phase("std", std_loss(ctx.lam), ctx.epochs, teacher=ctx.teacher, after_step=hooks)
    result = TaskResult(phases=[ctx.engine.run(ctx.model, ctx.data, phase)])
    if wa:
        result.record["before_wa"] = ctx.evaluate().to_json()
        result.record["wa_factor"] = weight_align(ctx.model, ctx.num_old)
    return result
