"""The in-memory image set every data source returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ImageSet:
    """Decoded images of one split, ready to move to the training device.

    Attributes:
        images: uint8 tensor [N, 3, H, W] at the training resolution (RGB).
        labels: int64 tensor [N]; ``labels[i]`` indexes ``class_names``.
        class_names: the names of the classes, in label order.
    """

    images: torch.Tensor
    labels: torch.Tensor
    class_names: list[str]

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim != 4 or self.images.shape[1] != 3:
            raise ValueError(f"images must be uint8 [N, 3, H, W], got {self.images.dtype} {tuple(self.images.shape)}")
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError("labels must be one per image")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def image_size(self) -> int:
        return int(self.images.shape[-1])

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(images, labels), as the device path joins them (the exemplar memory gives the same pair)."""
        return self.images, self.labels

    @classmethod
    def joined(cls, parts: list[ImageSet], class_names: list[str]) -> ImageSet:
        """The images of ``parts`` one after the other (labels already in the order of ``class_names``);
        no images (``0 x 3 x 1 x 1``) when there are no parts."""
        if not parts:
            return cls(torch.zeros(0, 3, 1, 1, dtype=torch.uint8), torch.zeros(0, dtype=torch.long), list(class_names))
        return cls(torch.cat([p.images for p in parts]), torch.cat([p.labels for p in parts]), list(class_names))

    @classmethod
    def labels_only(cls, labels: torch.Tensor, class_names: list[str]) -> ImageSet:
        """A set whose pixels were streamed through a frozen backbone (:mod:`sbcli.data.stream`) and not kept:
        images ``[N, 3, 0, 0]`` (no bytes), the labels as given. Only a step that takes precomputed features
        (``TaskContext.features``) and keeps no exemplars is given one."""
        return cls(torch.zeros(len(labels), 3, 0, 0, dtype=torch.uint8), labels.long(), list(class_names))

    def subset(self, keep: torch.Tensor) -> "ImageSet":
        """The images whose ``keep`` mask (bool [N]) or index tensor selects them."""
        return ImageSet(self.images[keep], self.labels[keep], list(self.class_names))
