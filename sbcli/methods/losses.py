"""The losses of the paper (docs/method.md §4), one small function each."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn import functional as F

if TYPE_CHECKING:
    from sbcli.engine.loop import LossFn, StepOutputs

TEMPERATURE = 2.0  # docs/method.md §4: T = 2


def ce_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """CE: mean cross-entropy over all seen-class logits, all samples."""
    return F.cross_entropy(logits, targets)


def localized_ce(logits: torch.Tensor, targets: torch.Tensor, num_old: int) -> torch.Tensor:
    """LCE (localised cross-entropy): CE over the new logits only, on the new-class samples only.

    Labels are shifted by -C_old; exemplars (labels < C_old) are left out of the average (0 when
    the batch has no new-class sample). Written as a masked mean, so it never reads the device.
    """
    is_new = targets >= num_old
    per_sample = F.cross_entropy(logits[:, num_old:], (targets - num_old).clamp_min(0), reduction="none")
    return (per_sample * is_new).sum() / is_new.sum().clamp_min(1)


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = TEMPERATURE) -> torch.Tensor:
    """KD: KL(softmax(teacher / T) || softmax(student / T)), batch mean, without the T^2 factor.

    Both arguments are the logits of the same classes (the old ones, for the paper's KD).
    """
    log_p_student = F.log_softmax(student_logits.float() / temperature, dim=1)
    p_teacher = F.softmax(teacher_logits.float() / temperature, dim=1)
    return F.kl_div(log_p_student, p_teacher, reduction="batchmean")


def kd_ce_loss(logits: torch.Tensor, targets: torch.Tensor, teacher_logits: torch.Tensor, lam: float) -> torch.Tensor:
    """The standard loss: lambda * KD(old logits) + (1 - lambda) * CE, lambda = C_old / C_total."""
    num_old = teacher_logits.shape[1]
    return lam * kd_loss(logits[:, :num_old], teacher_logits) + (1 - lam) * ce_loss(logits, targets)


# As phase losses: what a Phase takes (StepOutputs -> loss).

def ce(out: StepOutputs) -> torch.Tensor:
    """Plain cross-entropy over every seen class."""
    return ce_loss(out.logits, out.targets)


def kd_ce(num_old: int, lam: float) -> LossFn:
    """The STD loss, lambda * KD(the teacher's old logits) + (1 - lambda) * CE, as a phase loss."""

    def loss(out: StepOutputs) -> torch.Tensor:
        return kd_ce_loss(out.logits, out.targets, out.teacher_logits[:, :num_old], lam)

    return loss
