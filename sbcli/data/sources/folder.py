"""Class-per-folder images (the ImageFolder layout), any common format."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sbcli.data import pixels, progress
from sbcli.data.imageset import ImageSet
from sbcli.data.sources.decode_cache import DecodeCache, fingerprint, stat_line
from sbcli.data.sources.decode import decode_many, is_image_name, to_imageset
from sbcli.data.walk import walk_stats
from sbcli.errors import ConfigError, DataError


@dataclass(frozen=True)
class FolderReport:
    """What :func:`load_folder` read.

    Attributes:
        data: the decoded images, labels and class names (sorted folder names).
        skipped: how many files were skipped because they are not images by their extension
            (hidden files such as ``.DS_Store`` and files beside the class folders included).
        skipped_examples: up to five of those, relative to the root, to show the user.
    """

    data: ImageSet
    skipped: int
    skipped_examples: tuple[str, ...] = ()


@dataclass(frozen=True)
class _FolderListing:
    """The files of a class-per-folder tree, before decoding."""

    class_names: list[str]
    files: list[Path]
    labels: list[int]
    skipped: list[str]
    fingerprint: str


def load_folder(root: Path, image_size: int, *, cache: DecodeCache | None) -> FolderReport:
    """Load class-per-folder images: ``root/<class>/**/<image>``.

    Class names are the sorted names of the subfolders (hidden ones ignored); images may sit
    in nested folders below their class folder. Every image is converted to RGB and resized.

    Args:
        root: the folder holding one subfolder per class.
        image_size: the side of the square images returned.
        cache: where decoded data is kept between runs, or None to always decode.

    Returns:
        The images and the count of files skipped as not images.

    Raises:
        DataError: the folder is missing, has no class folders, a class folder has no images, an
            image file is not a regular file or is larger than ``pixels.MAX_IMAGE_BYTES`` (both
            refused while listing, before anything is decoded), or an image cannot be decoded (the
            message names the file).
        ConfigError: ``image_size`` is not positive.
    """
    if image_size < 1:
        raise ConfigError(f"Image size must be at least 1 pixel, got {image_size}; pass a positive image size.")
    root = Path(root).expanduser()
    listing = _scan_folder(root)
    key = DecodeCache.key("folder", root, image_size, listing.fingerprint)
    hit = cache.get(key) if cache is not None else None
    if hit is not None:
        data, extra = hit
        return FolderReport(data, int(extra.get("skipped", 0)), tuple(extra.get("skipped_examples", ())))
    keys = [str(path) for path in listing.files]
    images = decode_many(keys, _read_path, str, image_size, doing=f"Decoding images in {root}")
    report = FolderReport(
        to_imageset(images, listing.labels, listing.class_names), len(listing.skipped), tuple(listing.skipped[:5])
    )
    if cache is not None:
        cache.put(key, report.data, {"skipped": report.skipped, "skipped_examples": list(report.skipped_examples)})
    return report


def _read_path(key: str) -> bytes:
    """The bytes of an image file named by its path (a regular file of bounded size)."""
    return pixels.read_image_file(Path(key))


def _scan_folder(root: Path) -> _FolderListing:
    """List the class folders and their images, checking the layout."""
    if not root.exists():
        raise DataError(f"Image folder {root} does not exist; check the path.")
    if not root.is_dir():
        raise DataError(f"{root} is a file, not a folder; pass a folder with one subfolder of images per class.")
    entries = sorted(root.iterdir(), key=lambda p: p.name)
    class_dirs = [p for p in entries if p.is_dir() and not p.name.startswith(".")]
    if not class_dirs:
        raise DataError(
            f"No class folders in {root}; put the images of each class in their own subfolder, e.g. {root / 'cat' / '001.jpg'}."
        )
    skipped = [p.name for p in entries if not p.is_dir()]
    stat_lines = [stat_line(name, root / name) for name in skipped]
    files: list[Path] = []
    labels: list[int] = []
    listed = progress.Counter(f"Listing images in {root}", "files")
    for label, class_dir in enumerate(class_dirs):
        images = _scan_class(class_dir, skipped, stat_lines, listed)
        if not images:
            raise DataError(f"No images found in {class_dir}; put at least one image file in each class folder.")
        files += images
        labels += [label] * len(images)
    listed.done()
    return _FolderListing([p.name for p in class_dirs], files, labels, skipped, fingerprint(stat_lines))


def _scan_class(class_dir: Path, skipped: list[str], stat_lines: list[str],
                listed: progress.Counter) -> list[Path]:
    """The image files below one class folder, sorted; other files are appended to ``skipped``."""
    images: list[Path] = []
    prefix = len(str(class_dir)) + 1  # walk_stats joins onto class_dir: its paths start with it
    for path, st in walk_stats(class_dir):
        name = class_dir.name + "/" + str(path)[prefix:].replace(os.sep, "/")  # relative to root, no re-parsing
        stat_lines.append(stat_line(name, path, st))
        listed.add()
        if is_image_name(path.name):
            pixels.check_image_file(path, st)  # a FIFO or a huge file refused now, not after decoding the rest
            images.append(path)
        else:
            skipped.append(name)  # hidden files too: macOS "._x.jpg" files are not images
    return images

