"""The teachers a later step distils from: the previous model frozen, and double distillation's pair."""

from __future__ import annotations

import copy

import torch
from torch import nn


def frozen_copy(model: nn.Module) -> nn.Module:
    """A frozen teacher: a deep copy in eval mode whose parameters take no gradient."""
    teacher = copy.deepcopy(model).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


class PairTeacher(nn.Module):
    """Both teachers of double distillation in one forward: [old model's logits | temporary network's logits]."""

    def __init__(self, old: nn.Module, new: nn.Module) -> None:
        super().__init__()
        self.old, self.new = old, new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.old(x), self.new(x)], dim=1)
