"""Decoding shared by every source: one image, many on a thread pool, and file listing.

Encoded images are decoded on a thread pool (Pillow releases the GIL while decoding and
resizing). Measured on a 2-core VM shared with another busy process: the 50,000 train JPEGs
(64x64) of the 100-class Tiny-ImageNet subset decode in about 10 s straight from the zip, and
CIFAR-10's 50,000 32x32 JPEGs as class folders in about 9 s; a decode-cache hit loads either in
under a second.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

from sbcli.data import walk
from sbcli.data.imageset import ImageSet
from sbcli.data.rgb import IMAGE_EXTENSIONS, to_rgb
from sbcli.errors import DataError

_DECODE_CHUNK = 256  # images per thread-pool task: large enough to amortise the task overhead


def decode_image(data: bytes, image_size: int) -> np.ndarray:
    """Decode one encoded image to RGB at ``image_size`` x ``image_size``.

    EXIF rotation is applied (phone photos store it there), alpha is dropped as torchvision's
    ``pil_loader`` does, and the image is resized with Pillow's antialiased bilinear filter,
    without keeping its aspect ratio.

    Args:
        data: the bytes of a file in any format Pillow reads.
        image_size: the side of the square output.

    Returns:
        uint8 array [3, image_size, image_size].

    Raises:
        OSError, SyntaxError, ValueError, Image.DecompressionBombError: Pillow cannot decode it.
    """
    with Image.open(io.BytesIO(data)) as image:
        # JPEG can decode at 1/2, 1/4 or 1/8 scale: a big photo then costs a fraction to decode.
        image.draft(None, (image_size, image_size))
        rgb = to_rgb(ImageOps.exif_transpose(image))
    if rgb.size != (image_size, image_size):
        rgb = rgb.resize((image_size, image_size), Image.Resampling.BILINEAR)
    return np.asarray(rgb).transpose(2, 0, 1)


def _decode_one(key: str, read: Callable[[str], bytes], describe: Callable[[str], str], image_size: int) -> np.ndarray:
    """Read and decode one image, turning every failure into a :class:`DataError`."""
    try:
        data = read(key)
    except (OSError, zipfile.BadZipFile) as err:
        raise DataError(f"Cannot read {describe(key)} ({err}); check that the file is readable.") from err
    try:
        return decode_image(data, image_size)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise DataError(f"Cannot decode image {describe(key)} ({err}); remove or replace the file.") from err


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
    keys: Sequence[str], read: Callable[[str], bytes], describe: Callable[[str], str], image_size: int
) -> np.ndarray:
    """Decode many images on a thread pool.

    Args:
        keys: what identifies each image to ``read`` (a path, a zip member name).
        read: returns the encoded bytes of one key; called from worker threads.
        describe: names a key for error messages (e.g. its full path).
        image_size: the side of the square output.

    Returns:
        uint8 array [len(keys), 3, image_size, image_size], in the order of ``keys``.

    Raises:
        DataError: an image cannot be read or decoded; the message names it.
    """
    out = np.empty((len(keys), 3, image_size, image_size), dtype=np.uint8)
    chunks = [range(i, min(i + _DECODE_CHUNK, len(keys))) for i in range(0, len(keys), _DECODE_CHUNK)]
    with ThreadPoolExecutor(max_workers=_worker_count()) as pool:
        futures = [pool.submit(_decode_chunk, keys, chunk, read, describe, out) for chunk in chunks]
        try:
            for future in futures:
                future.result()
        finally:
            for future in futures:  # after a failure, drop the work not yet started
                future.cancel()
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

