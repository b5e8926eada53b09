"""Fine-tuning: CE on the new task's images plus the exemplars; the usual lower bound."""

from __future__ import annotations

from dataclasses import dataclass

from sbcli.errors import ConfigError
from sbcli.methods.base import INFERENCE_HELP, TaskContext, TaskResult, option, register_method


@dataclass(frozen=True)
class Config:
    inference: str = option("none", INFERENCE_HELP)
    first_task_rules: bool = option(True, "Step 1 keeps the head bias at zero and clips negative head weights "
                                          "(the authors' code).")

    def __post_init__(self) -> None:
        if self.inference != "none":
            raise ConfigError("finetune uses the plain head; drop --inference or use --method std for wa/bic/icarl.")


@register_method("finetune", Config, "CE on new data plus exemplars (lower bound)", ("none",),
                 title="fine-tuning on new data plus exemplars (the lower bound)")
def learn_task(ctx: TaskContext, cfg: Config) -> TaskResult:
    from sbcli.engine.loop import Phase
    from sbcli.methods.common import ce, learn_first_task

    if ctx.step == 0:
        return learn_first_task(ctx, cfg.first_task_rules)
    return TaskResult(phases=[ctx.engine.run(ctx.model, ctx.data, Phase("finetune", ce, ctx.epochs))])
