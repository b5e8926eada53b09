"""The device-resident data path (airbench style): uint8 images on the device, batches drawn by
permutation, crop/flip/normalise done on the device for a whole batch at once."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.nn import functional as F

CIFAR100_MEAN = (0.5071, 0.4867, 0.4408)
CIFAR100_STD = (0.2675, 0.2565, 0.2761)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Normalization:
    """Per-channel mean and std of images scaled to [0, 1]."""

    mean: tuple[float, float, float] = CIFAR100_MEAN
    std: tuple[float, float, float] = CIFAR100_STD

    def to_json(self) -> dict:
        return {"mean": list(self.mean), "std": list(self.std)}

    @classmethod
    def from_json(cls, data: dict) -> "Normalization":
        return cls(tuple(data["mean"]), tuple(data["std"]))  # type: ignore[arg-type]


@dataclass(frozen=True)
class DeviceData:
    """Training images (uint8 [N, 3, H, W]) and learner labels (int64 [N]) on one device."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @classmethod
    def join(cls, parts: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> "DeviceData":
        """Concatenate (images, labels) pairs on ``device`` (e.g. new task data plus exemplars)."""
        parts = [(x, y) for x, y in parts if len(y)]
        images = torch.cat([x.to(device) for x, _ in parts])
        labels = torch.cat([y.to(device) for _, y in parts]).long()
        return cls(images, labels)

    def batch_indices(self, batch_size: int, generator: torch.Generator, drop_last: bool = True) -> Iterator[torch.Tensor]:
        """Index tensors of one epoch: a random permutation cut into batches.

        The last partial batch is dropped, as in the authors' code, unless it would be the only one.
        """
        n = len(self)
        perm = torch.randperm(n, generator=generator).to(self.images.device)
        stop = n - n % batch_size if drop_last and n >= batch_size else n
        for start in range(0, stop, batch_size):
            yield perm[start : start + batch_size]


def random_crop(images: torch.Tensor, padding: int, generator: torch.Generator) -> torch.Tensor:
    """Random crop with zero padding of a batch [B, C, H, W], one offset per image."""
    if padding == 0:
        return images
    b, _, h, w = images.shape
    padded = F.pad(images, (padding,) * 4)
    # drawn where the generator lives: a device generator costs no host copy (no sync) per batch
    dy = torch.randint(0, 2 * padding + 1, (b, 1), generator=generator, device=generator.device).to(images.device)
    dx = torch.randint(0, 2 * padding + 1, (b, 1), generator=generator, device=generator.device).to(images.device)
    rows = (dy + torch.arange(h, device=images.device))[:, :, None]
    cols = (dx + torch.arange(w, device=images.device))[:, None, :]
    batch = torch.arange(b, device=images.device)[:, None, None]
    return padded[batch, :, rows, cols].permute(0, 3, 1, 2)


def random_flip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Flip each image of the batch horizontally with probability 1/2."""
    flip = (torch.rand(images.shape[0], generator=generator, device=generator.device) < 0.5).to(images.device)
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


@functools.lru_cache(maxsize=32)
def _scale_shift(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``1 / (255 std)`` and ``-mean / std`` as [1, 3, 1, 1] float32 tensors on ``device``.

    Made once per (normalisation, device) and reused: building them per batch meant two host
    allocations and two host-to-device copies in every training step. Read-only constants.
    """
    m, s = torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)
    scale, shift = (1.0 / (255.0 * s)).float(), (-m / s).float()
    return scale.view(1, 3, 1, 1).to(device), shift.view(1, 3, 1, 1).to(device)


def normalize(images: torch.Tensor, norm: Normalization, channels_last: bool = False) -> torch.Tensor:
    """uint8 [B, 3, H, W] -> float32 ``(x / 255 - mean) / std``, optionally in channels-last layout."""
    scale, shift = _scale_shift(tuple(norm.mean), tuple(norm.std), images.device)
    out = torch.addcmul(shift, images.float(), scale)  # one fused pass: x * scale + shift
    return out.contiguous(memory_format=torch.channels_last) if channels_last else out


def augment(images: torch.Tensor, norm: Normalization, generator: torch.Generator, channels_last: bool = False) -> torch.Tensor:
    """The training augmentation: crop with zero padding (H / 8 px), flip, normalise."""
    images = random_crop(images, images.shape[-1] // 8, generator)
    images = random_flip(images, generator)
    return normalize(images, norm, channels_last)
