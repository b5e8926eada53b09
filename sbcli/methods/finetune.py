"""Fine-tuning: CE on the new task's images plus the exemplars; the usual lower bound."""

from __future__ import annotations

from dataclasses import dataclass

from sbcli.engine.loop import Phase
from sbcli.errors import ConfigError
from sbcli.methods.base import TaskContext, TaskResult, register_method
from sbcli.methods.common import ce, learn_first_task


@dataclass(frozen=True)
class Config:
    inference: str = "none"  # the plain head
    first_task_rules: bool = True  # authors' code: zero head bias, clip negative head weights in step 1

    def __post_init__(self) -> None:
        if self.inference != "none":
            raise ConfigError("finetune uses the plain head; drop --inference or use --method std for wa/bic/icarl.")


@register_method("finetune", Config, "CE on new data plus exemplars (lower bound)")
def learn_task(ctx: TaskContext, cfg: Config) -> TaskResult:
    if ctx.step == 0:
        return learn_first_task(ctx, cfg.first_task_rules)
    return TaskResult(phases=[ctx.engine.run(ctx.model, ctx.data, Phase("finetune", ce, ctx.epochs))])
