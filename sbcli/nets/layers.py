"""Convolution and linear layers whose cross-branch weights can be masked to exactly zero.

A mask is a fixed 0/1 buffer of the weight's shape. While it is set, the forward pass uses
``weight * mask`` (so masked weights neither act nor receive gradient) and
:func:`sbcli.nets.partition.enforce_masks` zeroes them after every optimiser step (so weight decay
and momentum cannot move them). Removing the mask (``set_mask(None)``) is the bridge.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class MaskedConv2d(nn.Conv2d):
    """``nn.Conv2d`` without bias and with an optional block-diagonal weight mask."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False)
        self.register_buffer("mask", None, persistent=False)

    def set_mask(self, mask: torch.Tensor | None) -> None:
        self.mask = None if mask is None else mask.to(self.weight.device, self.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self.mask is None else self.weight * self.mask
        return F.conv2d(x, weight, None, self.stride, self.padding)


class MaskedLinear(nn.Linear):
    """``nn.Linear`` with an optional weight mask; its rows can grow (see :meth:`expand`)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=True)
        self.register_buffer("mask", None, persistent=False)

    def reset_parameters(self) -> None:
        if self.out_features:  # a head of no classes yet (a learner waiting for its first task) has nothing to draw
            super().reset_parameters()

    def set_mask(self, mask: torch.Tensor | None) -> None:
        self.mask = None if mask is None else mask.to(self.weight.device, self.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self.mask is None else self.weight * self.mask
        return F.linear(x, weight, self.bias)

    @torch.no_grad()
    def expand(self, num_new: int) -> "MaskedLinear":
        """A head with ``num_new`` more rows: old rows and biases copied, new rows default-initialised."""
        grown = MaskedLinear(self.in_features, self.out_features + num_new).to(self.weight.device, self.weight.dtype)
        grown.weight[: self.out_features] = self.weight
        grown.bias[: self.out_features] = self.bias
        return grown

    @torch.no_grad()
    def rows(self, keep: list[int]) -> "MaskedLinear":
        """A head of the rows ``keep`` alone, in that order (classes taken out: ``sb forget``)."""
        kept = MaskedLinear(self.in_features, len(keep)).to(self.weight.device, self.weight.dtype)
        kept.weight.copy_(self.weight[keep])
        kept.bias.copy_(self.bias[keep])
        return kept


class GrowingHead(nn.Module):
    """A network whose classifier is ``self.head`` (a :class:`MaskedLinear`) over pooled features: the
    head's part of the interface every sbcli network shares (subclasses define ``forward_features``)."""

    head: MaskedLinear

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def num_classes(self) -> int:
        return self.head.out_features

    def forward_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def expand_classes(self, num_new: int) -> None:
        """Grow the head by ``num_new`` classes, keeping the old rows and biases."""
        if num_new > 0:
            self.head = self.head.expand(num_new)

    def keep_classes(self, keep: list[int]) -> None:
        """Keep the head's rows of the classes ``keep`` alone (old ids, in their new order)."""
        self.head = self.head.rows(keep)
