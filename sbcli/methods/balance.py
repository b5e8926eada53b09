"""Class-balanced fine-tuning (``--balance-epochs``): after a later step, a short phase on the memory alone.

At a small budget the new classes outnumber the old ones' exemplars many times over (250 images
a class against 10 to 25), and the network ends a step biased towards the new classes; weight
aligning rescales the head but cannot undo what the features forgot. Once the memory holds its
per-class quota of every seen class (the new ones included), it is a class-balanced training set:
a few epochs of cross-entropy on it at a small learning rate (EEIL, Castro et al. 2018; LUCIR's
class-balanced fine-tuning) give every seen class the same weight. The task loop
(:func:`sbcli.run.steps.learn_step`) runs it after the first step for every method whose inference rule takes it
(:func:`sbcli.methods.base.balance_epochs`); under weight
aligning the head bias stays at zero, as in the method's own phases.

Measured before it became the own-data default: docs/lab/benchmarks.md ("Keeping the old classes").
"""

from __future__ import annotations

import torch

from sbcli.data.device import DeviceData
from sbcli.engine.loop import Engine, Phase, PhaseReport
from sbcli.methods.losses import ce
from sbcli.nets.head import zero_head_bias
from sbcli.nets.resnet import IncrementalResNet


def balance_phase(epochs: int, lr: float, hold_bias_at_zero: bool) -> Phase:
    """The phase: plain cross-entropy over every seen class, its own learning rate."""
    hooks = (zero_head_bias,) if hold_bias_at_zero else ()
    return Phase("balance", ce, epochs, after_step=hooks, lr=lr)


def balanced_finetune(model: IncrementalResNet, memory: tuple[torch.Tensor, torch.Tensor], engine: Engine,
                      epochs: int, lr: float, hold_bias_at_zero: bool) -> PhaseReport | None:
    """Fine-tune ``model`` on the exemplar memory (class-balanced by its quotas); None when it is empty."""
    images, labels = memory
    if epochs <= 0 or len(labels) == 0:
        return None
    phase = balance_phase(epochs, lr, hold_bias_at_zero)
    if hold_bias_at_zero:
        zero_head_bias(model)
    return engine.run(model, DeviceData.join([(images, labels)], engine.device), phase)
