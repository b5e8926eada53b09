"""What a run is about to do, said once at its start: the data found, its resolution, the network,
the epochs, the device and the precision (the API builds it; the terminal prints :meth:`RunBanner.text`),
and for the experiment logs the settings the run starts with and the epochs the learner trained before.
It is what watchers are told at ``on_start`` (:mod:`sbcli.watch.watcher`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import torch

from sbcli.engine.hardware import uses_bf16
from sbcli.engine.loop import TrainConfig

PEEK = 32  # image files whose size is read (headers only) to tell whether a folder's images get resized


@dataclass(frozen=True)
class RunBanner:
    """The facts of a run's start."""

    classes: int
    train_images: int
    test_images: int
    image_size: int
    resized_from: list[str] = field(default_factory=list)  # "640x480": other sizes the images come in
    network: str = ""  # "resnet18, width x0.25"
    epochs: int = 0  # a phase's epochs
    balance_epochs: int = 0
    device: str = "cpu"
    precision: str = "fp32"  # what the steps train in: bf16 or fp32 (fp32 where nothing trains: features are float32)
    options: dict = field(default_factory=dict)  # the settings the run starts with, as an experiment log records them
    epochs_before: int = 0  # epochs the learner trained before this run (a log's epochs count on from there)
    known_images: int = 0  # more images of classes the learner knows (sb add-task), besides train_images

    def text(self) -> str:
        test = f", {self.test_images} test images" if self.test_images else ", no test images"
        resized = ""
        if self.resized_from:
            more = " and other sizes" if len(self.resized_from) > 2 else ""
            resized = f" (resized from {', '.join(self.resized_from[:2])}{more})"
        balance = (f" (and {self.balance_epochs} of class-balanced fine-tuning after each later step)"
                   if self.balance_epochs else "")
        epochs = (f"{self.epochs} epoch{'s' if self.epochs != 1 else ''} a phase{balance}" if self.epochs
                  else "no training (the backbone stays frozen: one pass over the images)")
        # a frozen backbone trains nothing: its one pass computes features in float32 (Engine.features)
        compute = f" in {self.precision}" if self.epochs else ", features in fp32"
        known = (f" and {self.known_images} more images of classes the learner knows" if self.known_images else "")
        found = (f"{self.classes} classes, {self.train_images} training images{known}" if self.classes or not known
                 else f"no new class and {self.known_images} more images of classes the learner knows")
        return (f"Found {found}{test}; "
                f"at {self.image_size}x{self.image_size} pixels{resized}; {self.network}; "
                f"{epochs}; on {self.device}{compute}.")


def native_sizes(images: torch.Tensor | None) -> list[str]:
    """The size of decoded images (a benchmark's own resolution), as ``WxH``."""
    if images is None or images.dim() != 4:
        return []
    return [f"{images.shape[-1]}x{images.shape[-2]}"]


def folder_sizes(root: Path, limit: int = PEEK) -> list[str]:
    """The sizes (``WxH``, most common first) of up to ``limit`` image files of a class-per-folder tree, from
    their headers; files Pillow cannot open are left to the loader, which names them."""
    from PIL import Image, UnidentifiedImageError

    counts: dict[str, int] = {}
    for path in islice(Path(root).rglob("*"), limit * 4):  # a few files, not a listing of every image
        if sum(counts.values()) >= limit:
            break
        if not path.is_file() or path.name.startswith("."):
            continue
        try:
            with Image.open(path) as image:
                size = f"{image.width}x{image.height}"
        except (OSError, UnidentifiedImageError, ValueError):
            continue
        counts[size] = counts.get(size, 0) + 1
    return sorted(counts, key=lambda s: -counts[s])


def banner(classes: int, train_images: int, test_images: int, image_size: int, sizes: list[str], network: str,
           train: TrainConfig, device: torch.device, trains: bool = True, options: dict | None = None,
           epochs_before: int = 0, known_images: int = 0) -> RunBanner:
    """The banner of a run that trains at ``image_size`` on images that come in ``sizes`` (``trains``: False for a
    method that trains nothing in this run, such as a ridge head or prototypes on a frozen backbone)."""
    square = f"{image_size}x{image_size}"
    return RunBanner(classes, train_images, test_images, image_size, [s for s in sizes if s != square], network,
                     train.epochs if trains else 0, (train.balance_epochs or 0) if trains else 0, str(device),
                     "bf16" if trains and uses_bf16(train.precision, device) else "fp32", dict(options or {}),
                     epochs_before, known_images)
