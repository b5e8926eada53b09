"""The learning rate of every optimiser step of a phase: a linear warm-up, then step decay.

The decay is the authors' multi-step schedule (x0.1 at 60/120/160 of 200 epochs, scaled to the
phase's epochs). The warm-up multiplies it by (k + 1) / W for the first W optimiser steps of the
phase (k = 0, 1, ...), W = round(warmup_epochs * steps per epoch) (Goyal et al. 2017): the first
steps of a fresh SGD at lr 0.1 on a randomly initialised network can blow the loss up and leave
it stuck at chance (docs/lab/benchmarks.md, "Early collapse"). warmup_epochs = 0 is the paper's
schedule, exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def steps_per_epoch(num_images: int, batch_size: int, drop_last: bool = True) -> int:
    """Optimiser steps of one epoch: full batches only, or one partial batch when that is all there is;
    with ``drop_last`` off, the last partial batch too (as :meth:`sbcli.data.device.DeviceData.batch_indices`
    draws them)."""
    if num_images == 0:
        return 0
    if not drop_last:
        return -(-num_images // batch_size)
    return num_images // batch_size if num_images >= batch_size else 1


@dataclass
class PhaseSchedule:
    """Sets the optimiser's learning rate before every step; :meth:`step` ends an epoch."""

    optimizer: torch.optim.Optimizer
    base_lr: float
    milestones: tuple[int, ...]  # epochs (0-based) from which one more decay applies
    decay: float
    warmup_steps: int = 0
    epoch: int = 0
    steps_done: int = 0
    current: float = float("nan")  # the learning rate of the last step set (read without the device)

    def lr(self, epoch: int, step: int) -> float:
        """The learning rate of optimiser step ``step`` (0-based, counted over the phase) in ``epoch`` (0-based)."""
        value = self.base_lr * self.decay ** sum(epoch >= m for m in self.milestones)
        if step < self.warmup_steps:
            value *= (step + 1) / self.warmup_steps
        return value

    def before_step(self) -> None:
        """Set the learning rate of the next optimiser step: a Python float, or filled into the device tensor
        that holds it for a replayed step (:func:`sbcli.engine.graphs.device_lr`); no device sync either way."""
        lr = self.lr(self.epoch, self.steps_done)
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        self.current = lr
        self.steps_done += 1

    def step(self) -> None:
        """The end of an epoch."""
        self.epoch += 1


def make_schedule(optimizer: torch.optim.Optimizer, base_lr: float, fractions: tuple[float, ...], decay: float,
                  epochs: int, batches_per_epoch: int, warmup_epochs: float = 0.0) -> PhaseSchedule:
    """Milestones at ``fractions`` of the phase's ``epochs`` (60/120/160 of 200), warm-up over
    ``warmup_epochs`` epochs of ``batches_per_epoch`` steps."""
    milestones = tuple(sorted({max(1, round(f * epochs)) for f in fractions}))
    warmup = max(0, round(warmup_epochs * batches_per_epoch))
    return PhaseSchedule(optimizer, base_lr, milestones, decay, warmup_steps=warmup)
