"""A network's names, shapes and dtypes without its numbers: what checks and estimates need before anything is allocated."""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from sbcli.nets.layers import GrowingHead


class _NoDraws(TorchFunctionMode):
    """Initialisers draw nothing. On the ``meta`` device there is nothing to draw into, yet drawing a normal there
    goes through torch's reference implementations, whose first use imports torch._dynamo: 0.8 s of every load of an
    ImageNet-style ResNet on a 2-core CPU, for numbers that do not exist."""

    DRAWS = frozenset({torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.erfinv_, torch.Tensor.exponential_,
                       torch.Tensor.random_})

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in self.DRAWS:
            return args[0]
        return func(*args, **(kwargs or {}))


def meta_model(arch: str, num_classes: int, width: float = 1.0) -> GrowingHead:
    """``create_model(arch, num_classes, width)`` on the ``meta`` device: every tensor with its name, shape and dtype,
    no memory and no initialisation."""
    from sbcli.nets import create_model

    with torch.device("meta"), _NoDraws():
        return create_model(arch, num_classes, width)
