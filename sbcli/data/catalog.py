"""Where a run's images come from: a JSON-able source spec, opened into train and test sets.

A spec is stored in the learner for every task, so that later steps (``sb add-task``) and
``sb evaluate`` can reload the test images of every class seen (the decode cache makes that
cheap). Benchmarks: ``demo``, ``cifar10``, ``cifar100``, ``tiny-imagenet``; anything else is a
path: a Tiny-ImageNet directory or zip, or a class-per-folder directory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from sbcli.data import sources
from sbcli.data.device import CIFAR100_MEAN, CIFAR100_STD, IMAGENET_MEAN, IMAGENET_STD, Normalization
from sbcli.data.imageset import ImageSet
from sbcli.errors import DataError
from sbcli.source_kinds import BENCHMARKS

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Opened:
    """A source's train and test sets, the normalisation it asks for, and what was skipped."""

    train: ImageSet
    test: ImageSet | None
    norm: Normalization | None  # None: compute from the training images
    skipped: int = 0


def is_class_folders(source: str | None) -> bool:
    """Whether ``sb train SOURCE`` reads ``source`` as a class-per-folder directory (not the demo, a benchmark by
    name, a zip or a Tiny-ImageNet folder; a path that does not exist counts, and is refused when it is read)."""
    if source is None or source in BENCHMARKS:
        return False
    path = Path(source).expanduser()
    return not (path.suffix == ".zip" or (path / "wnids.txt").is_file())


def resolve_spec(source: str | None, *, test: str | None, image_size: int | None, data_root: str | None,
                 download: bool) -> dict:
    """Turn what the user typed into a source spec (no decoding yet)."""
    if source in (None, "demo"):
        return {"kind": "demo"}
    if source in ("cifar10", "cifar100"):
        root = Path(data_root or Path.home() / ".cache" / "sbcli" / "datasets").expanduser().resolve()
        return {"kind": source, "root": str(root), "download": download}
    if source == "tiny-imagenet":
        if data_root is None:
            raise DataError("tiny-imagenet needs --data-root: the official directory or tiny-imagenet-200.zip.")
        return {"kind": "tiny-imagenet", "path": str(Path(data_root).expanduser().resolve())}
    path = Path(source).expanduser().resolve()
    if not path.exists():
        raise DataError(f"{source} is neither a benchmark ({', '.join(BENCHMARKS)}) nor an existing folder; check the path.")
    if path.suffix == ".zip" or (path / "wnids.txt").is_file():
        return {"kind": "tiny-imagenet", "path": str(path)}
    spec = {"kind": "folder", "path": str(path), "image_size": image_size or 32}
    if test is not None:
        test_path = Path(test).expanduser().resolve()
        if not test_path.is_dir():
            raise DataError(f"The test folder {test} does not exist; give a class-per-folder directory.")
        spec["test"] = str(test_path)
    return spec


def spec_image_size(spec: dict) -> int:
    return {"demo": 32, "cifar10": 32, "cifar100": 32, "tiny-imagenet": 64}.get(spec["kind"], spec.get("image_size", 32))


def open_spec(spec: dict, train: bool = True, test: bool = True, *, download: bool = False) -> Opened:
    """Decode (or read from the cache) the sets a spec names.

    Only ``download`` (the user's own ``--download`` now) lets CIFAR be downloaded: a spec read
    from a learner, whatever it records, never downloads anything.
    """
    kind, cache = spec["kind"], sources.DecodeCache.default()
    if kind == "demo":
        return Opened(sources.load_demo(True) if train else None, sources.load_demo(False) if test else None, None)
    if kind in ("cifar10", "cifar100"):
        root, dl = Path(spec["root"]), download
        norm = Normalization(CIFAR100_MEAN, CIFAR100_STD)
        return Opened(sources.load_cifar(root, kind, True, download=dl) if train else None,
                      sources.load_cifar(root, kind, False, download=dl) if test else None, norm)
    if kind == "tiny-imagenet":
        path, norm = Path(spec["path"]), Normalization(IMAGENET_MEAN, IMAGENET_STD)
        return Opened(sources.load_tiny_imagenet(path, True, cache=cache) if train else None,
                      sources.load_tiny_imagenet(path, False, cache=cache) if test else None, norm)
    return _open_folders(spec, train, test, cache)


def _open_folders(spec: dict, train: bool, test: bool, cache: "sources.DecodeCache") -> Opened:
    train_set, test_set, skipped = None, None, 0
    if train:
        report = sources.load_folder(Path(spec["path"]), spec["image_size"], cache=cache)
        train_set, skipped = report.data, report.skipped
        _report_skipped(report, spec["path"])
    if test and spec.get("test"):
        report = sources.load_folder(Path(spec["test"]), spec["image_size"], cache=cache)
        test_set, skipped = report.data, skipped + report.skipped
        _report_skipped(report, spec["test"])
    return Opened(train_set, test_set, None, skipped)


def _report_skipped(report: "sources.FolderReport", path: str) -> None:
    if report.skipped:
        LOG.warning("Skipped %d files in %s that are not images (e.g. %s).", report.skipped, path,
                    ", ".join(report.skipped_examples))


def relabel(images: ImageSet, class_names: list[str], keep: list[str]) -> ImageSet:
    """The images of the classes ``keep`` with labels re-indexed into ``class_names``.

    ``class_names`` is the learner's label order; ``keep`` must be a subset of both.
    """
    index = {name: i for i, name in enumerate(class_names)}
    lookup = torch.full((len(images.class_names),), -1, dtype=torch.long)
    for i, name in enumerate(images.class_names):
        if name in keep and name in index:
            lookup[i] = index[name]
    new = lookup[images.labels]
    mask = new >= 0
    return ImageSet(images.images[mask], new[mask], list(class_names))


def compute_normalization(images: torch.Tensor) -> Normalization:
    """Per-channel mean and std of uint8 images [N, 3, H, W] scaled to [0, 1]."""
    x = images[: 20000].float() / 255.0
    mean = x.mean(dim=(0, 2, 3))
    std = x.std(dim=(0, 2, 3)).clamp_min(1e-3)
    return Normalization(tuple(round(float(v), 4) for v in mean), tuple(round(float(v), 4) for v in std))
