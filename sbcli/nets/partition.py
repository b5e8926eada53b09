"""The partition of the network's top into an old and a new branch (spec sections 3 to 5).

From rho, C_old and C_total follow the split fraction bf, the old/new channel groups of every
partitioned channel set, the cross blocks of every partitioned tensor, the sparsity penalty on
those blocks, and the two events of a split step: ``disconnect`` and ``bridge``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from sbcli.nets.resnet import IncrementalResNet, PartitionedLayer

SOFT_OWN = 0.982  # authors' code: membership of a channel in its own group
SOFT_OTHER = 0.018  # ... and in the other group


def split_fraction(rho: float, num_old: int, num_total: int) -> float:
    """bf = min(1, rho * C_old / C_total) (spec section 3)."""
    return min(1.0, rho * num_old / num_total)


@dataclass(frozen=True)
class Partition:
    """Old-group sizes of every channel set: channels ``[0, old)`` are old, ``[old, width)`` new."""

    bf: float
    old: dict[str, int]
    width: dict[str, int]

    @property
    def is_split(self) -> bool:
        """False when some set would have an empty new (or old) group: the step is not split."""
        return all(0 < self.old[s] < self.width[s] for s in self.old)

    def new(self, channel_set: str) -> int:
        return self.width[channel_set] - self.old[channel_set]

    def to_json(self) -> dict:
        return {"bf": self.bf, "old": dict(self.old), "width": dict(self.width), "is_split": self.is_split}


def channel_widths(model: IncrementalResNet) -> dict[str, int]:
    """The width of every channel set named by the model's partitioned layers."""
    widths: dict[str, int] = {}
    for layer in model.partitioned_layers():
        weight = layer.module.weight
        widths[layer.out_set] = weight.shape[0]
        widths[layer.in_set] = weight.shape[1]
    return widths


def make_partition(model: IncrementalResNet, rho: float, num_old: int) -> Partition:
    """Old groups for every channel set: floor(width * bf); head rows: the C_old old classes."""
    widths = channel_widths(model)
    bf = split_fraction(rho, num_old, model.num_classes)
    old = {s: math.floor(w * bf) for s, w in widths.items()}
    old["classes"] = num_old
    return Partition(bf=bf, old=old, width=widths)


def _group_vector(old: int, width: int, device: torch.device) -> torch.Tensor:
    """1 for the channels of the old group, 0 for the new group."""
    vec = torch.zeros(width, device=device)
    vec[:old] = 1.0
    return vec


def _expand(mask2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return mask2d.reshape(*mask2d.shape, *([1] * (weight.ndim - 2))).expand_as(weight)


def cross_mask(layer: PartitionedLayer, partition: Partition) -> torch.Tensor:
    """1 on the cross weights (old-in to new-out, new-in to old-out) of ``layer``, 0 elsewhere."""
    weight = layer.module.weight
    out_old = _group_vector(partition.old[layer.out_set], weight.shape[0], weight.device)
    in_old = _group_vector(partition.old[layer.in_set], weight.shape[1], weight.device)
    same = torch.outer(out_old, in_old) + torch.outer(1 - out_old, 1 - in_old)
    return _expand(1.0 - same, weight)


@torch.no_grad()
def cross_norm(model: IncrementalResNet, partition: Partition) -> float:
    """The L2 norm of all cross weights together (recorded before disconnect)."""
    total = sum(float((l.module.weight * cross_mask(l, partition)).pow(2).sum()) for l in model.partitioned_layers())
    return math.sqrt(total)


def sparsity_paper(model: IncrementalResNet, partition: Partition) -> torch.Tensor:
    """Paper form of the sparsity penalty: sum over tensors of ||W_on||_2 + ||W_no||_2."""
    terms = []
    for layer in model.partitioned_layers():
        weight = layer.module.weight
        out_old = _group_vector(partition.old[layer.out_set], weight.shape[0], weight.device)
        in_old = _group_vector(partition.old[layer.in_set], weight.shape[1], weight.device)
        for block in (torch.outer(out_old, 1 - in_old), torch.outer(1 - out_old, in_old)):
            terms.append((weight * _expand(block, weight)).pow(2).sum().add(1e-12).sqrt())
    return torch.stack(terms).sum()


def _soft(old: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft memberships (old group, new group) of every channel: 0.982 own, 0.018 other."""
    is_old = _group_vector(old, width, device)
    own, other = SOFT_OWN, SOFT_OTHER
    return is_old * own + (1 - is_old) * other, (1 - is_old) * own + is_old * other


def group_lasso(layer: PartitionedLayer, partition: Partition) -> torch.Tensor:
    """Authors' per-tensor group lasso over cross rows and columns, normalised by fan-in.

    For each group g, every output row is weighted by its membership in g and penalised by the
    L2 norm of its weights from the other group's inputs; likewise every input column.
    """
    weight = layer.module.weight
    w = weight.reshape(weight.shape[0], weight.shape[1], -1)
    out_g = _soft(partition.old[layer.out_set], weight.shape[0], weight.device)
    in_g = _soft(partition.old[layer.in_set], weight.shape[1], weight.device)
    total = weight.new_zeros(())
    for g, other in ((0, 1), (1, 0)):
        rows = (w * in_g[other][None, :, None]).pow(2).sum(dim=(1, 2)).add(1e-12).sqrt()
        cols = (w * out_g[other][:, None, None]).pow(2).sum(dim=(0, 2)).add(1e-12).sqrt()
        total = total + (out_g[g] * rows).sum() + (in_g[g] * cols).sum()
    fan_in = weight[0].numel()
    return total / fan_in


def sparsity_code(model: IncrementalResNet, partition: Partition) -> torch.Tensor:
    """Authors' form of the sparsity penalty: per-tensor group lasso, combined as a self-weighted mean.

    Each tensor's value is weighted by its share of the total (computed without gradient).
    """
    values = torch.stack([group_lasso(layer, partition) for layer in model.partitioned_layers()])
    weights = values.detach() / values.detach().sum().clamp_min(1e-12)
    return (weights * values).sum()


def disconnect(model: IncrementalResNet, partition: Partition) -> None:
    """Set every cross weight to exactly zero and mask it so that it stays zero (spec section 5)."""
    with torch.no_grad():
        for layer in model.partitioned_layers():
            keep = 1.0 - cross_mask(layer, partition)
            layer.module.weight.mul_(keep)
            layer.module.set_mask(keep)


def bridge(model: IncrementalResNet) -> None:
    """Remove the masks: the cross weights, exactly zero now, become ordinary trainable weights."""
    for layer in model.partitioned_layers():
        layer.module.set_mask(None)


@torch.no_grad()
def enforce_masks(model: nn.Module) -> None:
    """Zero the masked weights again after an optimiser step (weight decay, momentum)."""
    for module in model.modules():
        mask = getattr(module, "mask", None)
        if mask is not None:
            module.weight.mul_(mask)


def reset_split_batchnorms(model: IncrementalResNet) -> None:
    """The authors' code re-creates the stage-4 BatchNorms at disconnect and bridge (``--bn-reset``)."""
    for bn in model.split_batchnorms():
        bn.reset_parameters()
        bn.reset_running_stats()
