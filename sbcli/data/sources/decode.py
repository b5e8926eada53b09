"""Decoding shared by every source: one image, many on a thread pool, and file listing.

Encoded images are decoded on a thread pool (Pillow releases the GIL while decoding and
resizing). Measured on a 2-core CPU shared with another busy process: the 50,000 train JPEGs
(64x64) of the 100-class Tiny-ImageNet subset decode in about 10 s straight from the zip, and
CIFAR-10's 50,000 32x32 JPEGs as class folders in about 9 s; a decode-cache hit loads either in
under a second.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import UnidentifiedImageError

from sbcli.data import pixels, progress, walk
from sbcli.data.imageset import ImageSet
from sbcli.data.rgb import IMAGE_EXTENSIONS
from sbcli.errors import DataError

_DECODE_CHUNK = 256  # images per thread-pool task: large enough to amortise the task overhead


def decode_image(data: bytes, image_size: int, name: str = "image") -> np.ndarray:
    """Decode one encoded image to RGB at ``image_size`` x ``image_size`` (:func:`sbcli.data.pixels.decode`).

    EXIF rotation is applied (phone photos store it there), alpha is dropped as torchvision's
    ``pil_loader`` does, a JPEG decodes at a reduced DCT scale still at least ``image_size`` (a
    big photo then costs a fraction to decode), and the image is resized with Pillow's
    antialiased bilinear filter, without keeping its aspect ratio. ``sb serve`` decodes with the
    same function, so a served model sees the pixels it was trained on.

    Args:
        data: the bytes of a file in any format Pillow reads.
        image_size: the side of the square output.
        name: how errors name the image.

    Returns:
        uint8 array [3, image_size, image_size].

    Raises:
        ImageTooLargeError: it would decode to more than ``pixels.DEFAULT_MAX_PIXELS`` pixels.
        OSError, SyntaxError, ValueError: Pillow cannot decode it.
    """
    return pixels.decode(data, image_size, image_size, name=name)


def _decode_one(key: str, read: Callable[[str], bytes], describe: Callable[[str], str], image_size: int) -> np.ndarray:
    """Read and decode one image, turning every failure into a :class:`DataError`."""
    try:
        data = read(key)
    except (OSError, zipfile.BadZipFile) as err:
        raise DataError(f"Cannot read {describe(key)} ({err}); check that the file is readable.") from err
    try:
        return decode_image(data, image_size, describe(key))
    except (OSError, SyntaxError, ValueError) as err:
        # Pillow names what it read from (a BytesIO here) when no format matches: say why without it
        reason = "not an image format Pillow reads" if isinstance(err, UnidentifiedImageError) else str(err)
        raise DataError(f"Cannot decode image {describe(key)} ({reason}); remove or replace the file.") from err


def _decode_chunk(
    keys: Sequence[str],
    indices: range,
    read: Callable[[str], bytes],
    describe: Callable[[str], str],
    out: np.ndarray,
) -> None:
    """Decode ``keys[indices]`` into the matching rows of ``out`` (one thread-pool task)."""
    for i in indices:
        out[i] = _decode_one(keys[i], read, describe, out.shape[-1])


def decode_many(
    keys: Sequence[str], read: Callable[[str], bytes], describe: Callable[[str], str], image_size: int,
    doing: str = "Decoding images",
) -> np.ndarray:
    """Decode many images on a thread pool.

    Args:
        keys: what identifies each image to ``read`` (a path, a zip member name).
        read: returns the encoded bytes of one key; called from worker threads.
        describe: names a key for error messages (e.g. its full path).
        image_size: the side of the square output.
        doing: what the progress lines call this work.

    Returns:
        uint8 array [len(keys), 3, image_size, image_size], in the order of ``keys``.

    Raises:
        DataError: an image cannot be read or decoded; the message names it.
    """
    out = np.empty((len(keys), 3, image_size, image_size), dtype=np.uint8)
    chunks = [range(i, min(i + _DECODE_CHUNK, len(keys))) for i in range(0, len(keys), _DECODE_CHUNK)]
    with ThreadPoolExecutor(max_workers=_worker_count()) as pool:
        futures = [pool.submit(_decode_chunk, keys, chunk, read, describe, out) for chunk in chunks]
        decoded = progress.Counter(doing, "images", len(keys))
        try:
            for future, chunk in zip(futures, chunks, strict=True):
                future.result()
                decoded.add(len(chunk))
        finally:
            for future in futures:  # after a failure, drop the work not yet started
                future.cancel()
    decoded.done()
    return out


def _worker_count() -> int:
    """Threads for decoding: the CPUs this process may use (decoding is CPU-bound)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, min(16, len(os.sched_getaffinity(0))))
    return max(1, min(16, os.cpu_count() or 1))


def to_imageset(images: np.ndarray, labels: Sequence[int] | np.ndarray, class_names: Sequence[str]) -> ImageSet:
    """Wrap decoded arrays as an :class:`ImageSet`."""
    label_tensor = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    return ImageSet(torch.from_numpy(np.ascontiguousarray(images)), label_tensor, list(class_names))


def is_image_name(rel: str) -> bool:
    """Whether a file (a path or a '/'-separated tree path) is an image by its extension; hidden files are not."""
    name = rel.rpartition("/")[2]
    return not name.startswith(".") and Path(name).suffix.lower() in IMAGE_EXTENSIONS


def walk_files(folder: Path) -> Iterator[Path]:
    """Every file below ``folder`` in sorted order, following symlinks as ImageFolder does (loops refused)."""
    yield from walk.walk_files(folder)

