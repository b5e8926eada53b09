"""Shaping opened data for a run: a benchmark at another resolution, a subset of its classes.

The Python face (:mod:`sbcli.api`) only orchestrates; what a source's images look like by the
time they reach a task is decided here.
"""

from __future__ import annotations

import dataclasses

import torch

from sbcli.data.catalog import Opened, spec_image_size
from sbcli.data.imageset import ImageSet
from sbcli.errors import ConfigError

MIN_IMAGE_SIZE = 8  # below this a ResNet's strided stages leave nothing to pool


def with_image_size(spec: dict, image_size: int | None) -> dict:
    """A benchmark spec that records a resolution other than its native one (folders carry theirs)."""
    if image_size is None or spec["kind"] == "folder" or image_size == spec_image_size(spec):
        return spec
    if image_size < MIN_IMAGE_SIZE:
        raise ConfigError(f"--image-size {image_size} is too small; use {MIN_IMAGE_SIZE} pixels or more.")
    return {**spec, "image_size": image_size}


def only_classes(opened: Opened, classes: list[int]) -> Opened:
    """The images of the dataset classes ``classes`` alone (labels and class names unchanged)."""
    if len(classes) == len(opened.train.class_names):
        return opened
    keep = torch.tensor(classes)
    parts = {name: None if part is None else part.subset(torch.isin(part.labels, keep))
             for name, part in (("train", opened.train), ("test", opened.test))}
    return dataclasses.replace(opened, **parts)


def resize_opened(opened: Opened, spec: dict) -> Opened:
    """A benchmark's images resized to the spec's ``image_size`` when it has one."""
    size = spec.get("image_size")
    if spec["kind"] == "folder" or size is None:
        return opened
    return dataclasses.replace(opened, train=resized(opened.train, size), test=resized(opened.test, size))


def resized(images: ImageSet | None, size: int, chunk: int = 2048) -> ImageSet | None:
    """Antialiased bilinear resize of uint8 images, in chunks to bound the float copy."""
    if images is None or images.image_size == size:
        return images
    if len(images) == 0:
        return ImageSet(images.images.new_zeros(0, 3, size, size), images.labels, list(images.class_names))
    parts = [torch.nn.functional.interpolate(images.images[i : i + chunk].float(), size=(size, size), mode="bilinear",
                                             antialias=True, align_corners=False).round_().clamp_(0, 255).to(torch.uint8)
             for i in range(0, len(images), chunk)]
    return ImageSet(torch.cat(parts), images.labels, list(images.class_names))
