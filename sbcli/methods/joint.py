"""The oracle: one network trained jointly on every class seen, the upper bound of the comparison.

Every step starts again from fresh weights and trains with plain CE (the first task's rules) on
all training images of all classes seen so far; the model of the previous step is ignored. This
makes each step's accuracy the joint-training bound for the classes seen at that step, so the
oracle's curve and its average over steps 2..T can be read against the incremental methods
column by column (the paper quotes one number, its last step on two tasks). It costs
(T + 1) / 2 times one joint training of the whole dataset.

The images of earlier tasks are needed, which only a whole sequence (``sb train``) has: a learner
of this method refuses ``sb add-task``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sbcli.errors import ConfigError
from sbcli.methods.base import MethodConfig, TaskContext, TaskResult, register_method


@dataclass(frozen=True)
class Config(MethodConfig):
    """The plain head alone."""


@register_method("joint", Config, "oracle: retrain from scratch on every class seen (upper bound)")
def learn_task(ctx: TaskContext, cfg: Config) -> TaskResult:
    from sbcli.methods.first_task import learn_first_task

    if ctx.seen_data is None:
        raise ConfigError("--method joint retrains on the images of every class seen, which add-task does not have; "
                          "train the whole sequence with `sb train --method joint` instead.")
    if ctx.step > 0:
        reinitialise(ctx)
    data = ctx.seen_data()
    result = learn_first_task(dataclasses.replace(ctx, data=data), cfg.first_task_rules)
    result.record["joint_images"] = len(data)
    return result


def reinitialise(ctx: TaskContext) -> None:
    """Give ``ctx.model`` the weights of a freshly built network of the same size.

    Raises:
        ConfigError: the run gives no way to build a fresh network.
    """
    if ctx.make_aux_model is None:
        raise ConfigError("--method joint needs to build a fresh network, which this run cannot; use `sb train`.")
    ctx.model.load_state_dict(ctx.make_aux_model(ctx.num_total).state_dict())
