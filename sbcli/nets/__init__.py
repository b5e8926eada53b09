"""Networks: the CIFAR-style and ImageNet-style ResNets, the growing head and the Split-and-Bridge partition."""

from __future__ import annotations

from collections.abc import Callable

from sbcli.nets.resnet import IncrementalResNet, resnet18, resnet32
from sbcli.nets.resnet_in import resnet18_in, resnet34_in
from sbcli.nets.timm_backbone import TimmBackbone, is_timm_arch
from sbcli.registry import Registry

MODELS: Registry[Callable[..., IncrementalResNet]] = Registry("architecture")
MODELS.register("resnet18")(resnet18)
MODELS.register("resnet32")(resnet32)
MODELS.register("resnet18-in")(resnet18_in)
MODELS.register("resnet34-in")(resnet34_in)


def create_model(arch: str, num_classes: int, width: float = 1.0, zero_init_residual: bool = False) -> IncrementalResNet:
    """Build a registered architecture (``sb train --arch``) with ``num_classes`` outputs.

    ``zero_init_residual`` zeroes the last BN scale of every residual block (see
    :meth:`IncrementalResNet.zero_init_residual`); it only changes the initial weights.
    """
    if is_timm_arch(arch):  # --arch timm/NAME (the timm extra): frozen-backbone methods only
        return TimmBackbone(arch, num_classes, width)
    model = MODELS.get(arch)(num_classes=num_classes, width=width)
    if zero_init_residual:
        model.zero_init_residual()
    return model


def list_models() -> list[str]:
    return MODELS.names()


__all__ = ["IncrementalResNet", "create_model", "list_models"]
