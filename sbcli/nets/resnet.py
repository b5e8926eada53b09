"""CIFAR-style ResNet-18 and ResNet-32 with a growing linear head.

ResNet-18 follows the spec (section 2): a 3x3 stride-1 stem, no max-pool, four stages of two
BasicBlocks (64/128/256/512 x width), 1x1 strided shortcuts without BN as in the authors' code.
ResNet-32 is the iCaRL/PyCIL CIFAR net: three stages of five blocks, 16/32/64 x width.

Every network exposes ``num_features``, ``num_classes``, ``forward_features``,
``forward_head``, ``forward`` (a tensor of logits) and ``expand_classes``, and names the layers
Split-and-Bridge partitions with :meth:`partitioned_layers`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sbcli.nets.layers import GrowingHead, MaskedConv2d, MaskedLinear


@dataclass(frozen=True)
class PartitionedLayer:
    """One tensor of the partitioned top: which channel sets its input and output belong to.

    ``in_set`` / ``out_set`` name a channel set: ``"in"`` (the partitioned stage's input),
    ``"b<i>.mid"`` (inside block i), ``"b<i>.out"`` (block i's output where it has a shortcut
    convolution) and ``"classes"`` (the head's rows); every layer sharing a set shares its
    old/new split.
    """

    name: str
    module: nn.Module
    in_set: str
    out_set: str


class BasicBlock(nn.Module):
    """Two 3x3 convs with BN and ReLU, plus an identity or 1x1 strided shortcut (no BN in the CIFAR
    nets, as in the authors' code; with ``shortcut_bn``, a BN after it as in torchvision's ``downsample``)."""

    def __init__(self, in_planes: int, planes: int, stride: int, shortcut_bn: bool = False) -> None:
        super().__init__()
        self.conv1 = MaskedConv2d(in_planes, planes, 3, stride=stride, padding=1)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = MaskedConv2d(planes, planes, 3, stride=1, padding=1)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: MaskedConv2d | None = None
        self.shortcut_bn: nn.BatchNorm2d | None = None
        if stride != 1 or in_planes != planes:
            self.shortcut = MaskedConv2d(in_planes, planes, 1, stride=stride)
            if shortcut_bn:
                self.shortcut_bn = nn.BatchNorm2d(planes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        skip = x if self.shortcut is None else self.shortcut(x)
        if self.shortcut_bn is not None:
            skip = self.shortcut_bn(skip)
        return torch.relu(out + skip)


def _stage(in_planes: int, planes: int, blocks: int, stride: int, shortcut_bn: bool = False) -> nn.Sequential:
    layers = [BasicBlock(in_planes, planes, stride, shortcut_bn)]
    layers += [BasicBlock(planes, planes, 1, shortcut_bn) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


def _scaled(width: float, channels: int) -> int:
    return max(1, int(round(channels * width)))


class IncrementalResNet(GrowingHead):
    """A CIFAR-style ResNet whose last ``split_blocks`` blocks and head can be split in two."""

    def __init__(self, arch: str, widths: list[int], blocks: list[int], num_classes: int, split_blocks: int,
                 shortcut_bn: bool = False) -> None:
        super().__init__()
        self.arch = arch
        self.conv1 = MaskedConv2d(3, widths[0], 3, stride=1, padding=1)
        self.bn1 = nn.BatchNorm2d(widths[0])
        stages, in_planes = [], widths[0]
        for i, (planes, n) in enumerate(zip(widths, blocks, strict=True)):
            stages.append(_stage(in_planes, planes, n, 1 if i == 0 else 2, shortcut_bn))
            in_planes = planes
        self.stages = nn.Sequential(*stages)
        self.num_features = in_planes
        self.head = MaskedLinear(in_planes, num_classes)
        self.split_blocks = split_blocks

    def zero_init_residual(self) -> None:
        """Zero the last BN scale of every residual block (torchvision's ``zero_init_residual``, Goyal
        et al. 2017): each block starts as its shortcut, the identity where it has no projection."""
        for module in self.modules():
            if isinstance(module, BasicBlock):
                nn.init.zeros_(module.bn2.weight)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features [B, num_features] of normalised images [B, 3, H, W]."""
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.stages(out)
        return torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)

    def split_blocks_list(self) -> list[BasicBlock]:
        """The partitioned residual blocks, in forward order."""
        return list(self.stages[-1])[-self.split_blocks :]

    def partitioned_layers(self) -> list[PartitionedLayer]:
        """Every tensor of the partitioned top, with the channel sets of its input and output."""
        layers, in_set = [], "in"
        for i, block in enumerate(self.split_blocks_list()):
            mid = f"b{i}.mid"
            # an identity shortcut ties the block's output channels to its input channels
            out = in_set if block.shortcut is None else f"b{i}.out"
            layers.append(PartitionedLayer(f"b{i}.conv1", block.conv1, in_set, mid))
            layers.append(PartitionedLayer(f"b{i}.conv2", block.conv2, mid, out))
            if block.shortcut is not None:
                layers.append(PartitionedLayer(f"b{i}.shortcut", block.shortcut, in_set, out))
            in_set = out
        layers.append(PartitionedLayer("head", self.head, in_set, "classes"))
        return layers

    def split_batchnorms(self) -> list[nn.BatchNorm2d]:
        """The BatchNorm layers inside the partitioned blocks (reset by ``--bn-reset``)."""
        return [bn for block in self.split_blocks_list() for bn in (block.bn1, block.bn2, block.shortcut_bn)
                if bn is not None]


def resnet18(num_classes: int, width: float = 1.0) -> IncrementalResNet:
    """CIFAR-style ResNet-18 (docs/method.md §2); stage 4 and the head are partitioned."""
    widths = [_scaled(width, c) for c in (64, 128, 256, 512)]
    return IncrementalResNet("resnet18", widths, [2, 2, 2, 2], num_classes, split_blocks=2)


def resnet32(num_classes: int, width: float = 1.0) -> IncrementalResNet:
    """ResNet-32 of iCaRL/PyCIL; the last two blocks of its last stage and the head are partitioned."""
    widths = [_scaled(width, c) for c in (16, 32, 64)]
    return IncrementalResNet("resnet32", widths, [5, 5, 5], num_classes, split_blocks=2)
