"""Data-parallel training over processes and machines: torch.distributed with DDP, started by torchrun.

``torchrun --nproc-per-node N -m sbcli train ...`` starts N copies of the command with ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set. :func:`join` (called when
the API resolves its device) joins the process group they describe, NCCL on CUDA and gloo on CPU;
:func:`session` (the CLI's) also leaves it at the end. Everything else asks :func:`info`.

Who does what, with W processes:

* every rank draws the same permutation of every epoch (same seed) and trains on its own
  disjoint slice of each batch; DDP averages the gradients, so the optimiser steps agree; the
  teacher runs locally; each rank augments its slice with its own generator;
* at the end of a phase rank 0's weights and buffers (BatchNorm statistics) are broadcast, so
  every rank holds the same model;
* evaluation and feature extraction: each rank scores a contiguous shard of the images and the
  shards are gathered on every rank, so metrics (and herding) are identical everywhere;
* rank 0 alone writes the learner and prints progress; the exemplar memory it selects is
  broadcast to the others.

With one process (no torchrun) every function here is a no-op and :func:`info` is rank 0 of 1.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import distributed as dist
from torch import nn

RANK_SEED_STRIDE = 1_000_003  # a prime: per-rank augmentation seeds seed + rank * stride never collide


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the process group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        """True when more than one process trains together."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes and prints."""
        return self.rank == 0


def info() -> DistInfo:
    """The running process group's view of this process (rank 0 of 1 when there is none)."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistInfo()
    rank, world = dist.get_rank(), dist.get_world_size()
    return DistInfo(rank, world, int(os.environ.get("LOCAL_RANK", rank)))


def launched() -> DistInfo:
    """What the launcher (torchrun) asked for, from the environment, whether or not the group is up."""
    rank = int(os.environ.get("RANK", "0"))
    return DistInfo(rank, int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_RANK", rank)))


def is_main_process() -> bool:
    """True in the process that should print and write: rank 0, or the only process."""
    group = info()
    return group.is_main if group.enabled else launched().is_main


@contextmanager
def session(device: torch.device | str = "auto") -> Iterator[None]:
    """Run a block in the process group torchrun describes, if any.

    A group started here is left on exit (:func:`leave`); one already running (started by the
    caller) is used and left running. Without torchrun this does nothing.
    """
    started = launched().enabled and dist.is_available() and not dist.is_initialized()
    if started:
        _start_group(str(device))
    try:
        yield
    except BaseException:
        if started:
            leave(wait_for_peers=False)  # a peer may be gone: do not wait for it
        raise
    if started:
        leave(wait_for_peers=True)


def leave(wait_for_peers: bool) -> None:
    """Tear the process group down while the interpreter is fully alive, in this order.

    1. (normal exit) wait until every rank is here, so no rank closes its connections while a
       peer still has collectives in flight;
    2. collect the cyclic garbage: DDP wrappers sit in reference cycles and their reducers hold
       the group and its pending work; left to the interpreter's exit, they tore gloo down during
       finalization and the process aborted ("terminate called without an active exception");
    3. destroy the group, and collect again what it held.
    """
    if not dist.is_initialized():
        return
    if wait_for_peers:
        dist.barrier()
    gc.collect()
    dist.destroy_process_group()
    gc.collect()


def join(device: torch.device) -> torch.device:
    """Join the process group torchrun describes (once) and return this rank's device.

    With CUDA and several processes each local rank gets its own GPU, ``cuda:LOCAL_RANK``.
    Without torchrun this returns ``device`` unchanged.
    """
    if launched().enabled and dist.is_available() and not dist.is_initialized():
        _start_group(device.type)
    group = info()
    if device.type != "cuda" or not group.enabled:
        return device
    local = torch.device("cuda", group.local_rank % torch.cuda.device_count())
    torch.cuda.set_device(local)
    return local


def _start_group(device: str) -> None:
    """NCCL for a CUDA run (``auto`` is one when CUDA is present), gloo on CPU."""
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    dist.init_process_group("nccl" if cuda else "gloo")


def rank_seed(seed: int, rank: int) -> int:
    """A distinct seed per rank for draws that must differ between ranks (augmentation)."""
    return seed + rank * RANK_SEED_STRIDE


def shard(indices: torch.Tensor, group: DistInfo) -> torch.Tensor:
    """This rank's disjoint, contiguous slice of a batch's indices (sizes differ by at most one)."""
    if not group.enabled:
        return indices
    return torch.tensor_split(indices, group.world_size)[group.rank]


def shard_range(count: int, group: DistInfo) -> tuple[int, int]:
    """[start, stop) of this rank's contiguous shard of ``count`` items."""
    per = -(-count // group.world_size)
    start = min(count, group.rank * per)
    return start, min(count, start + per)


def gather_rows(local: torch.Tensor, count: int, group: DistInfo) -> torch.Tensor:
    """Concatenate every rank's shard (from :func:`shard_range`) in rank order: ``count`` rows.

    Each shard is padded to the same length for ``all_gather`` and trimmed afterwards.
    """
    if not group.enabled:
        return local
    per = -(-count // group.world_size)
    padded = local.new_zeros((per, *local.shape[1:]))
    padded[: len(local)] = local
    parts = [torch.empty_like(padded) for _ in range(group.world_size)]
    dist.all_gather(parts, padded.contiguous())
    bounds = [shard_range(count, DistInfo(r, group.world_size)) for r in range(group.world_size)]
    return torch.cat([part[: stop - start] for part, (start, stop) in zip(parts, bounds, strict=True)])


def all_reduce_sum(value: torch.Tensor, group: DistInfo) -> torch.Tensor:
    """The sum of ``value`` over all ranks (``value`` itself with one process)."""
    if group.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def broadcast_module(model: nn.Module, group: DistInfo) -> None:
    """Overwrite every rank's parameters and buffers with rank 0's (in place)."""
    if not group.enabled:
        return
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def broadcast_objects(values: list[Any], group: DistInfo) -> list[Any]:
    """Rank 0's ``values`` (picklable objects, tensors included) on every rank."""
    if not group.enabled:
        return values
    box = list(values)
    dist.broadcast_object_list(box, src=0)
    return box


def barrier(group: DistInfo) -> None:
    """Wait for every rank (no-op with one process)."""
    if group.enabled:
        dist.barrier()


def data_parallel(model: nn.Module, device: torch.device, group: DistInfo) -> nn.Module:
    """``model`` wrapped in DistributedDataParallel (which broadcasts rank 0's state), or itself.

    Gradients are averaged over ranks during backward; BatchNorm buffers follow rank 0's at every
    forward (``broadcast_buffers``), and :func:`broadcast_module` aligns them at the phase's end.
    """
    if not group.enabled:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True)
