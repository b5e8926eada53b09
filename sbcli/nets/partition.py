"""The partition of the network's top into an old and a new branch (docs/method.md §3 to §5).

From rho, C_old and C_total follow the split fraction bf, the old/new channel groups of every
partitioned channel set, the cross blocks of every partitioned tensor, the sparsity penalty on
those blocks, and the two events of a split step: ``disconnect`` and ``bridge``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch
from torch import nn

from sbcli.nets.resnet import IncrementalResNet, PartitionedLayer

# Authors' code: a channel's soft membership is softmax([2, -2]) over the two groups, i.e.
# sigmoid(4) = 0.98201 in its own group and 0.01799 in the other.
SOFT_OWN = 1.0 / (1.0 + math.exp(-4.0))
SOFT_OTHER = 1.0 - SOFT_OWN


def split_fraction(rho: float, num_old: int, num_total: int) -> Fraction:
    """bf = min(1, rho * C_old / C_total) (docs/method.md §3), as an exact fraction.

    rho is read as the decimal it was written as (1.2 is 6/5), so that floor(width * bf) has no
    rounding error where the product is a whole number (e.g. rho 1.2, C_old 100, C_total 120: bf = 1).
    """
    return min(Fraction(1), Fraction(repr(float(rho))) * num_old / num_total)


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
    return Partition(bf=float(bf), old=old, width=widths)


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
    layers = model.partitioned_layers()
    total = sum(float((layer.module.weight * cross_mask(layer, partition)).pow(2).sum()) for layer in layers)
    return math.sqrt(total)


def sparsity_paper(model: IncrementalResNet, partition: Partition) -> torch.Tensor:
    """Paper form of the sparsity penalty: sum over tensors of ||W_on||_2 + ||W_no||_2."""
    terms = []
    for layer in model.partitioned_layers():
        weight = layer.module.weight
        out_old = _group_vector(partition.old[layer.out_set], weight.shape[0], weight.device)
        in_old = _group_vector(partition.old[layer.in_set], weight.shape[1], weight.device)
        for block in (torch.outer(out_old, 1 - in_old), torch.outer(1 - out_old, in_old)):
            # vector_norm's gradient at 0 is 0 (not NaN), so no epsilon: the penalty is exactly 0
            # when every cross block is 0.
            terms.append(torch.linalg.vector_norm(weight * _expand(block, weight)))
    return torch.stack(terms).sum()


def _soft(old: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft memberships (old group, new group) of every channel: 0.982 own, 0.018 other."""
    is_old = _group_vector(old, width, device)
    own, other = SOFT_OWN, SOFT_OTHER
    return is_old * own + (1 - is_old) * other, (1 - is_old) * own + is_old * other


def group_lasso(layer: PartitionedLayer, partition: Partition) -> torch.Tensor:
    """Authors' per-tensor group lasso: SplitNet's group weight regularisation with two fixed groups.

    With soft memberships m (0.982 own group, 0.018 other) of the output and input channels, for
    each group g: every input column j costs m_in[other](j) * ||m_out[g] * W[:, j]|| and every output
    row o costs m_out[other](o) * ||m_in[g] * W[o, :]|| (norms over the kernel too). Column costs
    are divided by sqrt(C_in * C_out), row costs by C_out: the authors' code divides them by
    C_in * sqrt(C_out) and C_out * sqrt(C_in), then by the init std sqrt(1 / fan_in), and takes the
    norm of the kernel-averaged squares, so the kernel size cancels (docs/method.md).
    """
    weight = layer.module.weight
    w = weight.reshape(weight.shape[0], weight.shape[1], -1)
    c_out, c_in = w.shape[:2]
    out_g = _soft(partition.old[layer.out_set], c_out, weight.device)
    in_g = _soft(partition.old[layer.in_set], c_in, weight.device)
    total = weight.new_zeros(())
    for g, other in ((0, 1), (1, 0)):
        cols = torch.linalg.vector_norm(w * out_g[g][:, None, None], dim=(0, 2))
        rows = torch.linalg.vector_norm(w * in_g[g][None, :, None], dim=(1, 2))
        total = total + (in_g[other] * cols).sum() / math.sqrt(c_in * c_out) + (out_g[other] * rows).sum() / c_out
    return total


def sparsity_code(model: IncrementalResNet, partition: Partition) -> torch.Tensor:
    """Authors' form of the sparsity penalty: per-tensor group lasso, combined as a self-weighted mean.

    Each tensor's value is weighted by its share of the total (computed without gradient).
    """
    values = torch.stack([group_lasso(layer, partition) for layer in model.partitioned_layers()])
    weights = values.detach() / values.detach().sum().clamp_min(1e-12)
    return (weights * values).sum()


def disconnect(model: IncrementalResNet, partition: Partition) -> None:
    """Set every cross weight to exactly zero and mask it so that it stays zero (docs/method.md §5)."""
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
