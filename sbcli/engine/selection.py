"""``--val-fraction``: a validation split held out of each step's training data, and the best
checkpoint of every phase chosen on it (never on the test set).

Per step, ``fraction`` of each new class's training images and of each old class's exemplars
(at least one image a class where the class has two or more, never all of them) are held out
by a seeded draw; the phases train on the rest. Every ``every`` epochs and at the last epoch of a
phase the model's top-1 accuracy on the held-out images (argmax over all seen classes' logits)
is measured; the weights and BN statistics of the best epoch (the later one on a tie) are put
back when the phase ends. The exemplar memory is still chosen from all of the step's images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sbcli.metrics import top1


def holdout_mask(labels: torch.Tensor, fraction: float, seed: int) -> torch.Tensor:
    """True for the rows held out: round(fraction x n) of each class's n rows, at least 1 when n >= 2, at most n - 1."""
    held = torch.zeros(len(labels), dtype=torch.bool)
    if fraction <= 0 or len(labels) == 0:
        return held
    gen = torch.Generator().manual_seed(seed)
    for cls in torch.unique(labels.cpu()).tolist():
        rows = torch.nonzero(labels.cpu() == cls).flatten()
        n = len(rows)
        if n < 2:
            continue
        k = min(n - 1, max(1, math.floor(fraction * n + 0.5)))
        held[rows[torch.randperm(n, generator=gen)[:k]]] = True
    return held


def split(parts: list[tuple[torch.Tensor, torch.Tensor]], fraction: float, seed: int
          ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], tuple[torch.Tensor, torch.Tensor] | None]:
    """(the parts without their held-out rows, the held-out (images, labels) of all parts) or (parts, None)."""
    if fraction <= 0:
        return parts, None
    kept, held_images, held_labels = [], [], []
    parts = [(images, labels) for images, labels in parts if len(labels)]  # an empty memory at step 1
    for i, (images, labels) in enumerate(parts):
        held = holdout_mask(labels, fraction, seed * 7919 + i)
        kept.append((images[~held.to(images.device)], labels[~held.to(labels.device)]))
        held_images.append(images[held.to(images.device)])
        held_labels.append(labels[held.to(labels.device)])
    return kept, (torch.cat(held_images), torch.cat(held_labels))


@dataclass
class Validator:
    """The held-out images (uint8) and labels of a step, and how often a phase is scored on them."""

    images: torch.Tensor
    labels: torch.Tensor
    num_classes: int
    every: int = 0  # epochs between scores; 0: a fifth of the phase (at least 1)

    def score(self, engine: Any, model: nn.Module) -> float:
        return top1(engine.logits(model, self.images), self.labels.cpu())


class PhaseSelection:
    """The best epoch of one phase so far, and its weights."""

    def __init__(self, validator: Validator) -> None:
        self.validator = validator
        self.best = -math.inf
        self.epoch = 0
        self.state: dict[str, torch.Tensor] | None = None
        self.scores: list[float] = []

    @classmethod
    def start(cls, validator: Validator | None, model: nn.Module) -> PhaseSelection | None:
        """None when there is no validation split, or for a network of other outputs (DD's new-task network)."""
        if validator is None or len(validator.labels) == 0 or getattr(model, "num_classes", None) != validator.num_classes:
            return None
        return cls(validator)

    def after_epoch(self, engine: Any, model: nn.Module, epoch: int, epochs: int) -> None:
        every = self.validator.every or max(1, epochs // 5)
        if epoch % every and epoch != epochs:
            return
        score = self.validator.score(engine, model)
        self.scores.append(score)
        if score >= self.best:
            self.best, self.epoch = score, epoch
            self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def finish(self, model: nn.Module, epochs: int) -> dict:
        """Put the best epoch's weights back; what was chosen, for the phase's record."""
        if self.state is not None and self.epoch != epochs:
            model.load_state_dict(self.state)
        return {"selected_epoch": self.epoch, "val_accuracy": self.best, "val_scores": self.scores}
