"""ImageNet-style ResNet-18 and ResNet-34 (torchvision/timm layout) for photo resolutions.

A 7x7 stride-2 stem and a 3x3 stride-2 max pool (a quarter of the input side before stage 1),
four stages of BasicBlocks (2-2-2-2 or 3-4-6-3, 64/128/256/512 x width), 1x1 strided shortcut
convolutions followed by a BN (torchvision's ``downsample``). Split-and-Bridge partitions the
whole of stage 4 and the head, as on the CIFAR ResNet-18 (docs/method.md §3): for ResNet-18 the same
six tensors, for ResNet-34 its three blocks (the stage-3 output is the shared input in both).

Parameter names follow :class:`~sbcli.nets.resnet.IncrementalResNet`; torchvision's and timm's
map onto them one to one (``layerN.i`` -> ``stages.N-1.i``, ``downsample.0/1`` ->
``shortcut``/``shortcut_bn``, ``fc`` -> ``head``): see :func:`sbcli.hub.pretrained.map_timm_keys`.
"""

from __future__ import annotations

import torch
from torch import nn

from sbcli.nets.layers import MaskedConv2d
from sbcli.nets.resnet import IncrementalResNet, _scaled


class ImageNetResNet(IncrementalResNet):
    """:class:`IncrementalResNet` with the ImageNet stem (7x7 conv stride 2, BN, ReLU, max pool)."""

    def __init__(self, arch: str, widths: list[int], blocks: list[int], num_classes: int) -> None:
        super().__init__(arch, widths, blocks, num_classes, split_blocks=blocks[-1], shortcut_bn=True)
        self.conv1 = MaskedConv2d(3, widths[0], 7, stride=2, padding=3)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        for module in self.modules():  # torchvision's init of the convolutions
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        out = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        out = self.stages(out)
        return torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)


def resnet18_in(num_classes: int, width: float = 1.0) -> IncrementalResNet:
    """ImageNet-style ResNet-18 (torchvision ``resnet18``, timm ``resnet18``)."""
    widths = [_scaled(width, c) for c in (64, 128, 256, 512)]
    return ImageNetResNet("resnet18-in", widths, [2, 2, 2, 2], num_classes)


def resnet34_in(num_classes: int, width: float = 1.0) -> IncrementalResNet:
    """ImageNet-style ResNet-34 (torchvision ``resnet34``, timm ``resnet34``)."""
    widths = [_scaled(width, c) for c in (64, 128, 256, 512)]
    return ImageNetResNet("resnet34-in", widths, [3, 4, 6, 3], num_classes)
