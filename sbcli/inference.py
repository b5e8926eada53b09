"""Scores over every seen class for a learner's inference rule.

``wa``, ``none`` and ``bic`` live in the network's weights (WA is applied to the head, BiC is a
layer of the model), so their scores are the logits. Rules that need more than the forward pass
register a scorer here by name.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sbcli.engine import Engine
from sbcli.nets.resnet import IncrementalResNet

Scorer = Callable[[IncrementalResNet, dict[str, torch.Tensor], Engine, torch.Tensor], torch.Tensor]
SCORERS: dict[str, Scorer] = {}


def register_scorer(name: str) -> Callable[[Scorer], Scorer]:
    def add(fn: Scorer) -> Scorer:
        SCORERS[name] = fn
        return fn

    return add


def scores(model: IncrementalResNet, extra: dict[str, torch.Tensor], inference: str, engine: Engine,
           images: torch.Tensor) -> torch.Tensor:
    """Scores [N, C_seen] of uint8 images under the named inference rule."""
    scorer = SCORERS.get(inference)
    if scorer is None:
        return engine.logits(model, images)
    return scorer(model, extra, engine, images)
