"""The exemplar memory: a fixed total budget of stored training images of the classes seen.

Each seen class gets ceil(budget / C_seen) images, trimmed so the total is exactly the budget
(docs/method.md §5). Selection is ``random`` (seeded, default), ``herding`` (iCaRL) or ``first``
(dataset order, as in the authors' code). Each class's exemplars are kept in priority order, so
shrinking a class's quota keeps its first ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sbcli.errors import ConfigError

SELECTIONS = ("random", "herding", "first")
FeatureFn = Callable[[torch.Tensor], torch.Tensor]  # uint8 images [N, 3, H, W] -> pooled features [N, D]


def class_quotas(budget: int, num_classes: int) -> list[int]:
    """ceil(budget / C) per class, the last classes one fewer, so that the quotas sum to ``budget``."""
    if num_classes == 0:
        return []
    quota = math.ceil(budget / num_classes)
    excess = quota * num_classes - budget
    return [quota - 1 if c >= num_classes - excess else quota for c in range(num_classes)]


def herding_order(features: torch.Tensor, count: int) -> torch.Tensor:
    """iCaRL herding: greedily pick samples whose running mean stays closest to the class mean."""
    feats = torch.nn.functional.normalize(features.float(), dim=1)
    mean = feats.mean(0)
    chosen: list[int] = []
    running = torch.zeros_like(mean)
    available = torch.ones(len(feats), dtype=torch.bool)
    for k in range(1, min(count, len(feats)) + 1):
        candidate = (running[None] + feats) / k
        dist = (mean[None] - candidate).norm(dim=1)
        dist[~available] = float("inf")
        best = int(dist.argmin())
        chosen.append(best)
        available[best] = False
        running += feats[best]
    return torch.tensor(chosen, dtype=torch.long)


@dataclass
class ExemplarMemory:
    """Stored exemplars: uint8 images [M, 3, H, W] (CPU) and learner labels [M]."""

    budget: int
    selection: str = "random"
    seed: int = 0
    images: torch.Tensor | None = None
    labels: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.selection not in SELECTIONS:
            raise ConfigError(f"Unknown exemplar selection '{self.selection}'; choose one of {', '.join(SELECTIONS)}.")
        if self.budget < 0:
            raise ConfigError("--memory must be 0 or more exemplars.")

    def __len__(self) -> int:
        return 0 if self.labels is None else int(self.labels.shape[0])

    def per_class_counts(self) -> dict[int, int]:
        if self.labels is None:
            return {}
        values, counts = self.labels.unique(return_counts=True)
        return {int(v): int(c) for v, c in zip(values, counts, strict=True)}

    def update(self, images: torch.Tensor, labels: torch.Tensor, num_seen: int, features: FeatureFn | None = None) -> None:
        """Shrink the old classes to their new quota and add the classes present in ``labels``."""
        quotas = class_quotas(self.budget, num_seen)
        kept_x, kept_y = [], []
        for c, quota in enumerate(quotas):
            if self.labels is not None and bool((self.labels == c).any()):
                idx = (self.labels == c).nonzero().flatten()[:quota]
                kept_x.append(self.images[idx]), kept_y.append(self.labels[idx])
            elif bool((labels == c).any()):
                idx = self._select(images, (labels == c).nonzero().flatten(), quota, c, features)
                kept_x.append(images[idx].cpu()), kept_y.append(labels[idx].cpu())
        if kept_x:
            self.images, self.labels = torch.cat(kept_x), torch.cat(kept_y).long()

    def _select(self, images: torch.Tensor, idx: torch.Tensor, quota: int, label: int, features: FeatureFn | None) -> torch.Tensor:
        if self.selection == "first":
            return idx[:quota]
        if self.selection == "random":
            gen = torch.Generator().manual_seed(self.seed * 100003 + label)
            return idx[torch.randperm(len(idx), generator=gen)[:quota]]
        if features is None:
            raise ConfigError("Herding needs the model's features; none were given.")
        return idx[herding_order(features(images[idx]), quota)]

    def keep_classes(self, keep: list[int], num_classes: int) -> None:
        """Drop the exemplars of every class not in ``keep`` (old ids); the rest take their place in ``keep``."""
        if self.images is None or self.labels is None:
            return
        relabel = torch.full((num_classes,), -1, dtype=torch.long)
        relabel[torch.tensor(keep, dtype=torch.long)] = torch.arange(len(keep))
        rows = relabel[self.labels] >= 0
        self.images, self.labels = self.images[rows], relabel[self.labels[rows]]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(images, labels), empty tensors when the memory holds nothing yet."""
        if self.images is None or self.labels is None:
            return torch.zeros(0, 3, 1, 1, dtype=torch.uint8), torch.zeros(0, dtype=torch.long)
        return self.images, self.labels
