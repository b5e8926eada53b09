"""Operations on a network's classifier head that training hooks run: the bias held at zero, negative
weights clipped (the first task in the authors' code, weight-aligned training, Split-and-Bridge's phase A)."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def zero_head_bias(model: nn.Module) -> None:
    """Keep the head bias at zero (phase A, WA training, the first task in the authors' code)."""
    model.head.bias.zero_()


@torch.no_grad()
def clip_head_weights(model: nn.Module) -> None:
    """Clip negative head weights to zero (the authors' code, first task only)."""
    model.head.weight.clamp_(min=0.0)
