"""Networks: the CIFAR-style ResNets, the growing head and the Split-and-Bridge partition."""

from __future__ import annotations

from collections.abc import Callable

from sbcli.nets.resnet import IncrementalResNet, resnet18, resnet32
from sbcli.registry import Registry

MODELS: Registry[Callable[..., IncrementalResNet]] = Registry("architecture")
MODELS.register("resnet18")(resnet18)
MODELS.register("resnet32")(resnet32)


def create_model(arch: str, num_classes: int, width: float = 1.0) -> IncrementalResNet:
    """Build a registered architecture (``resnet18``, ``resnet32``) with ``num_classes`` outputs."""
    return MODELS.get(arch)(num_classes=num_classes, width=width)


def list_models() -> list[str]:
    return MODELS.names()


__all__ = ["IncrementalResNet", "create_model", "list_models"]
