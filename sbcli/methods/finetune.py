"""Fine-tuning: CE on the new task's images plus the exemplars; the usual lower bound."""

from __future__ import annotations

from dataclasses import dataclass

from sbcli.methods.base import MethodConfig, TaskContext, TaskResult, register_method


@dataclass(frozen=True)
class Config(MethodConfig):
    """The plain head alone (--method std offers wa, bic and icarl)."""


@register_method("finetune", Config, "CE on new data plus exemplars (lower bound)",
                 title="fine-tuning on new data plus exemplars (the lower bound)", any_backbone=True)
def learn_task(ctx: TaskContext, cfg: Config) -> TaskResult:
    from sbcli.engine.loop import Phase
    from sbcli.methods.first_task import learn_first_task
    from sbcli.methods.losses import ce

    if ctx.step == 0:
        return learn_first_task(ctx, cfg.first_task_rules)
    return TaskResult(phases=[ctx.engine.run(ctx.model, ctx.data, Phase("finetune", ce, ctx.epochs))])
