"""BiC's inference for the STD training: a bias layer on the current task's logits (Wu et al. 2019).

At step t > 1 a small class-balanced validation set is held out of the training data (``v``
images of every seen class, ``v`` = a tenth of the per-class exemplar quota after this step, as
BiC splits its memory 9:1), the network is trained with the STD loss on the rest (the teacher's
logits corrected by the previous step's bias layer), and then two parameters (alpha, beta) are fit
with CE on the validation logits:

    q_k = z_k                 for the old classes,
    q_k = alpha * z_k + beta  for the current task's classes.

The correction is kept in the learner as per-class ``bic.scale`` and ``bic.shift`` vectors (ones
and zeros for the old classes) plus the history of every step's (alpha, beta) in ``bic.steps``;
the network keeps its plain structure. Because the layer is affine in the logits it folds into
the head (:func:`fold_correction`), so inference and export use a plain network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sbcli.data.device import DeviceData
from sbcli.engine.loop import Phase
from sbcli.errors import ConfigError
from sbcli.methods.base import TaskContext, TaskResult
from sbcli.methods.losses import ce_loss, kd_ce
from sbcli.methods.rules.bic import SCALE_KEY, SHIFT_KEY, fold_correction  # noqa: F401  (the rule folds it)
from sbcli.metrics import top1

STEPS_KEY = "bic.steps"


@dataclass(frozen=True)
class BiasTraining:
    """How the bias layer is fit."""

    val_fraction: float = 0.1  # BiC: exemplars split 9:1 into train/validation
    iterations: int = 500  # full-batch Adam steps on the cached validation logits (2 parameters, milliseconds)
    lr: float = 0.05  # lets beta move by up to ~25 logits, more than any head bias seen in practice


def bias_correct(logits: torch.Tensor, num_old: int, alpha: torch.Tensor | float, beta: torch.Tensor | float) -> torch.Tensor:
    """BiC's bias layer: old logits unchanged, the current task's logits ``alpha * z + beta``."""
    return torch.cat([logits[:, :num_old], alpha * logits[:, num_old:] + beta], dim=1)


def correction_state(num_classes: int, num_old: int, alpha: float, beta: float,
                     history: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The learner state of one step's bias layer: per-class scale/shift and the (alpha, beta) history."""
    scale, shift = torch.ones(num_classes), torch.zeros(num_classes)
    scale[num_old:], shift[num_old:] = alpha, beta
    step = torch.tensor([[alpha, beta]])
    steps = step if history is None else torch.cat([history.reshape(-1, 2), step])
    return {SCALE_KEY: scale, SHIFT_KEY: shift, STEPS_KEY: steps}


def fit_bias_layer(logits: torch.Tensor, labels: torch.Tensor, num_old: int, cfg: BiasTraining) -> tuple[float, float]:
    """(alpha, beta) minimising CE of the corrected validation logits, from (1, 0)."""
    alpha = torch.ones((), requires_grad=True)
    beta = torch.zeros((), requires_grad=True)
    opt = torch.optim.Adam([alpha, beta], lr=cfg.lr)
    logits, labels = logits.detach().float().cpu(), labels.cpu()
    for _ in range(cfg.iterations):
        loss = ce_loss(bias_correct(logits, num_old, alpha, beta), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(alpha.detach()), float(beta.detach())


def validation_per_class(budget: int, num_classes: int, fraction: float) -> int:
    """Images per class held out: ``fraction`` of the per-class quota ceil(budget / C), at least one."""
    return max(1, round(fraction * math.ceil(budget / num_classes)))


def carve_validation(data: DeviceData, num_classes: int, per_class: int,
                     generator: torch.Generator) -> tuple[DeviceData, DeviceData]:
    """(training rest, validation): ``per_class`` random images of every class held out.

    Raises:
        ConfigError: a class has too few images to hold any out and still train on it.
    """
    labels = data.labels.cpu()
    val_parts = []
    for c in range(num_classes):
        idx = (labels == c).nonzero().flatten()
        if len(idx) <= per_class:
            raise ConfigError(f"--inference bic holds out {per_class} image(s) of every class for its bias layer, but "
                              f"class {c} has only {len(idx)} in memory; raise --memory.")
        val_parts.append(idx[torch.randperm(len(idx), generator=generator)[:per_class]])
    val = torch.cat(val_parts)
    keep = torch.ones(len(labels), dtype=torch.bool)
    keep[val] = False
    device = data.images.device
    rest = DeviceData(data.images[keep.to(device)], data.labels[keep.to(device)])
    return rest, DeviceData(data.images[val.to(device)], data.labels[val.to(device)])


def learn_bic_step(ctx: TaskContext, cfg: BiasTraining) -> TaskResult:
    """One incremental step of STD + BiC: hold out validation, train, fit the bias layer."""
    if ctx.memory_budget < ctx.num_total:
        raise ConfigError("--inference bic fits its bias layer on held-out exemplars; give --memory of at least "
                          f"one exemplar per class seen ({ctx.num_total}), better several.")
    per_class = validation_per_class(ctx.memory_budget, ctx.num_total, cfg.val_fraction)
    train, val = carve_validation(ctx.data, ctx.num_total, per_class, ctx.engine.generator)
    teacher = fold_correction(ctx.teacher, ctx.extra).eval()
    phase = Phase("std", kd_ce(ctx.num_old, ctx.lam), ctx.epochs, teacher=teacher)
    report = ctx.engine.run(ctx.model, train, phase)
    logits = ctx.engine.logits(ctx.model, val.images)
    labels = val.labels.cpu()
    alpha, beta = fit_bias_layer(logits, labels, ctx.num_old, cfg)
    record = {"bic_alpha": alpha, "bic_beta": beta, "bic_val_per_class": per_class,
              "bic_val_accuracy_before": top1(logits, labels),
              "bic_val_accuracy_after": top1(bias_correct(logits, ctx.num_old, alpha, beta), labels)}
    state = correction_state(ctx.num_total, ctx.num_old, alpha, beta, ctx.extra.get(STEPS_KEY))
    return TaskResult(phases=[report], record=record, extra_state=state)
