"""The carried test sample: held-out test images of every class a learner knows, inside the learner.

So that a learner can be evaluated on any machine, each step stores up to ``cap`` test images
per class (default 100, chosen at random with a per-class seed) at the training resolution, as
uint8 in ``test-sample.safetensors`` (tensors ``images`` [N, 3, S, S] and ``labels`` [N], labels
in the learner's order). ``learner.json`` keeps, under ``test_sample``, the cap, the images per
class and the tasks whose owner declined (``--no-test-sample``: private data), so that a sample
that does not match its learner is refused at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from sbcli.data.imageset import ImageSet
from sbcli.errors import LearnerError

DEFAULT_CAP = 100
FILE = "test-sample.safetensors"


@dataclass(frozen=True)
class CarriedSample:
    """uint8 images [N, 3, S, S] and int64 labels [N] in the learner's label order."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def counts(self, num_classes: int) -> list[int]:
        return torch.bincount(self.labels, minlength=num_classes).tolist() if len(self) else [0] * num_classes

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"images": self.images.contiguous(), "labels": self.labels.contiguous()}

    def of_classes(self, classes: list[int], class_names: list[str]) -> ImageSet:
        """The sample's images of ``classes`` (labels unchanged)."""
        keep = torch.isin(self.labels, torch.tensor(classes, dtype=torch.long))
        return ImageSet(self.images[keep], self.labels[keep], list(class_names))

    def kept(self, keep: list[int], num_classes: int) -> CarriedSample:
        """The sample of the classes ``keep`` alone (old ids), labelled by their place in ``keep``."""
        relabel = torch.full((num_classes,), -1, dtype=torch.long)
        relabel[torch.tensor(keep, dtype=torch.long)] = torch.arange(len(keep))
        rows = relabel[self.labels] >= 0
        return CarriedSample(self.images[rows], relabel[self.labels[rows]])

    @classmethod
    def empty(cls, image_size: int) -> CarriedSample:
        return cls(torch.zeros(0, 3, image_size, image_size, dtype=torch.uint8), torch.zeros(0, dtype=torch.long))


def take(test: ImageSet, classes: list[int], cap: int, seed: int) -> CarriedSample:
    """Up to ``cap`` images of each of ``classes`` from ``test`` (labels in the learner's order)."""
    picked: list[torch.Tensor] = []
    for label in classes:
        idx = (test.labels == label).nonzero().flatten()
        gen = torch.Generator().manual_seed(seed * 100003 + label)
        picked.append(idx[torch.randperm(len(idx), generator=gen)[:cap]].sort().values)
    index = torch.cat(picked) if picked else torch.zeros(0, dtype=torch.long)
    return CarriedSample(test.images[index].cpu(), test.labels[index].cpu().long())


def joined(old: CarriedSample | None, new: CarriedSample) -> CarriedSample:
    if old is None or len(old) == 0:
        return new
    if len(new) == 0:
        return old
    return CarriedSample(torch.cat([old.images, new.images]), torch.cat([old.labels, new.labels]))


def check(tensors: dict[str, torch.Tensor], recorded: list[int], num_classes: int, image_size: int,
          where: Path) -> CarriedSample:
    """The sample read from ``where``, checked against the images per class ``learner.json`` records of it
    (``recorded``: ``state.test_sample.counts``, :class:`sbcli.learner.records.TestSampleSettings`).

    Raises:
        LearnerError: wrong tensors, dtypes or shapes, labels outside the learner's classes, or
            images per class other than recorded: the sample belongs to another learner.
    """
    images, labels = tensors.get("images"), tensors.get("labels")
    fix = "remove the file and its `test_sample` entry from learner.json, or restore the learner from a copy"
    if images is None or labels is None or set(tensors) != {"images", "labels"}:
        raise LearnerError(f"{where} does not hold exactly the tensors 'images' and 'labels'; {fix}.")
    if images.dtype != torch.uint8 or images.ndim != 4 or tuple(images.shape[1:]) != (3, image_size, image_size):
        raise LearnerError(f"{where} holds {images.dtype} images of shape {tuple(images.shape)}, not uint8 "
                           f"[N, 3, {image_size}, {image_size}] as the learner's; {fix}.")
    if labels.dtype != torch.int64 or labels.shape != (images.shape[0],):
        raise LearnerError(f"{where} does not hold one int64 label per image; {fix}.")
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise LearnerError(f"{where} has labels outside the learner's {num_classes} classes: it does not match "
                           f"this learner; {fix}.")
    sample = CarriedSample(images, labels)
    counts = sample.counts(num_classes)
    expected = list(recorded)
    expected += [0] * (num_classes - len(expected))  # classes learned after the sample was recorded have none
    if counts != expected:
        raise LearnerError(f"{where} holds {counts} test images per class, learner.json records "
                           f"{recorded}: the sample does not match this learner's classes; {fix}.")
    return sample
