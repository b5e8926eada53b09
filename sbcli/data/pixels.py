"""Encoded image -> uint8 RGB at a model's input size: the one decoding that training and serving share.

:func:`decode` is what every training source (:mod:`sbcli.data.sources.decode`) and ``sb serve`` /
``sb predict`` (:mod:`sbcli.serve.preprocess`) call, so a served model sees the pixels it was
trained on. numpy and Pillow only (no torch), so that serving an ONNX file never imports torch.

Memory is bounded before anything is decoded. Pillow reads an image's header (its size) without
decoding the pixels; a JPEG is then set to decode at the smallest of 1/1, 1/2, 1/4 or 1/8 scale
that is still at least the target size (libjpeg's DCT scaling, Pillow's ``draft``), and an image
whose decoded size would pass ``max_pixels`` is refused (:class:`ImageTooLargeError`) before a
pixel is decoded. The pipeline holds one full-size image at a time (the EXIF rotation is applied
in place, an RGB image is not copied to convert it): about 4 bytes a pixel for 8-bit images (Pillow
stores RGB in 32 bits), up to about 20 for 16-bit gray on its way to 8 bits.

Pillow's own decompression-bomb check (a warning above ``Image.MAX_IMAGE_PIXELS``, about 89.5
megapixels of header size, and ``DecompressionBombError`` at twice that) runs first, inside
``Image.open``; its error, and its warning where a process turned warnings of that category into
errors (``sb serve`` does, see :func:`refuse_pillow_bombs`), are refused here as too large too.

Memory is bounded before a file is read, too: :func:`read_image_file`, which every training source
reads image files through, reads regular files only (a FIFO would block the read forever, a link to
``/dev/zero`` would never end) and refuses one larger than :data:`MAX_IMAGE_BYTES` from its size.
"""

from __future__ import annotations

import io
import os
import stat
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from sbcli.data.rgb import to_rgb
from sbcli.errors import DataError

#: Decoded pixels allowed per image unless a caller says otherwise: Pillow's own warning threshold.
DEFAULT_MAX_PIXELS = int(Image.MAX_IMAGE_PIXELS or 89_478_485)
#: Bytes read of one image file; a larger file is refused from its size before it is read. The cap
#: ``sb predict`` reads: above a JPEG or PNG photo of DEFAULT_MAX_PIXELS pixels (10 to 40 MiB), so that
#: only an uncompressed image of more than about 22 megapixels (BMP, TIFF) is refused by it alone.
MAX_IMAGE_BYTES = 64 * 2**20
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
# O_NONBLOCK: opening a FIFO swapped in after the stat returns at once (to be refused) instead of waiting
# for a writer; it changes nothing for a regular file. Windows has neither FIFOs nor the flag.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)

FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


class ImageTooLargeError(DataError):
    """An image whose decoded size passes the limit; refused before it is decoded."""

    def __init__(self, name: str, size: tuple[int, int] | None, limit: int) -> None:
        if size:
            sentence = (f"Image {name} would decode to {size[0]} x {size[1]} pixels ({size[0] * size[1]:,}), more than "
                        f"the {limit:,} pixels allowed per image; use a smaller image.")
        else:
            sentence = (f"Image {name} has more pixels than Pillow's decompression-bomb threshold "
                        f"({DEFAULT_MAX_PIXELS:,}); use a smaller image.")
        super().__init__(sentence)
        self.size = size
        self.limit = limit


def refuse_pillow_bombs() -> None:
    """Make Pillow's decompression-bomb warning an error in this process (a server's start-up policy).

    Pillow only warns between ``Image.MAX_IMAGE_PIXELS`` and twice that; a server must refuse, not
    log. :func:`decode` turns the error into :class:`ImageTooLargeError`.
    """
    warnings.filterwarnings("error", category=Image.DecompressionBombWarning)


def _opened(data: bytes, name: str, max_pixels: int) -> Image.Image:
    """``Image.open`` (the header only), with Pillow's bomb check refused as too large."""
    try:
        return Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ImageTooLargeError(name, None, max_pixels) from err


def _draft(image: Image.Image, width: int, height: int, draft: bool) -> tuple[int, int]:
    """Set a JPEG to decode at the smallest DCT scale still covering (width, height); the size it will decode to."""
    if draft:
        image.draft(None, (width, height))  # a no-op for every format but JPEG
    return image.size


def decoded_size(data: bytes, width: int, height: int, *, draft: bool = True, name: str = "image",
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, int]:
    """The (width, height) :func:`decode` would decode ``data`` at, from its header alone.

    Raises:
        ImageTooLargeError: Pillow's own bomb check refuses the header.
        OSError, SyntaxError, ValueError: Pillow cannot read the header.
    """
    with _opened(data, name, max_pixels) as image:
        return _draft(image, width, height, draft)


def decode(data: bytes, width: int, height: int, *, draft: bool = True, filter: str = "bilinear",  # noqa: A002
           max_pixels: int = DEFAULT_MAX_PIXELS, name: str = "image") -> np.ndarray:
    """uint8 [3, height, width] of one encoded image.

    EXIF rotation is applied (phone photos store it there), the image becomes 8-bit RGB
    (:func:`sbcli.data.rgb.to_rgb`: alpha dropped, gray replicated, 16-bit gray divided by 257)
    and is resized with Pillow's ``filter`` (bilinear: antialiased when shrinking), without
    keeping its aspect ratio. With ``draft``, a JPEG decodes at a reduced DCT scale first.

    Args:
        data: the bytes of a file in any format Pillow reads.
        width, height: the output size.
        draft: decode JPEGs at the smallest DCT scale still at least (width, height).
        filter: a key of :data:`FILTERS`.
        max_pixels: the most pixels decoded; a larger image is refused before it is decoded.
        name: how errors name the image.

    Raises:
        ImageTooLargeError: the image would decode to more than ``max_pixels`` pixels.
        OSError, SyntaxError, ValueError: Pillow cannot decode ``data``.
    """
    with _opened(data, name, max_pixels) as image:
        size = _draft(image, width, height, draft)
        if size[0] * size[1] > max_pixels:
            raise ImageTooLargeError(name, size, max_pixels)
        ImageOps.exif_transpose(image, in_place=True)  # no copy when there is nothing to rotate
        rgb = image if image.mode == "RGB" else to_rgb(image)  # convert("RGB") of RGB would copy
        if rgb.size != (width, height):
            rgb = rgb.resize((width, height), FILTERS[filter])
        # tobytes + frombuffer: half the time of np.asarray(rgb), which matters for many small images
        return np.frombuffer(rgb.tobytes(), dtype=np.uint8).reshape(height, width, 3).transpose(2, 0, 1)


def amount(size: int, *, exact: bool = False) -> str:
    """``size`` bytes for a message: ``"1,000 bytes"``, ``"64.0 MiB"``; ``exact`` drops a ``.0`` (for limits)."""
    for unit, name in ((2**30, "GiB"), (2**20, "MiB")):
        if size >= unit:
            return f"{size // unit} {name}" if exact and size % unit == 0 else f"{size / unit:.1f} {name}"
    return f"{size:,} bytes"


def too_large(name: str, size: int, limit: int = MAX_IMAGE_BYTES) -> DataError:
    """The refusal of an image file of ``size`` bytes, more than ``limit``."""
    return DataError(f"{name} is {amount(size)}, more than the {amount(limit, exact=True)} an image file may be; "
                     "remove it or replace it with a smaller image.")


def file_kind(path: Path, mode: int) -> str:
    """What a file that is not a regular file is, e.g. ``"a link to /dev/zero, a character device"``."""
    kind = next((name for test, name in _KINDS if test(mode)), "a special file")
    try:
        return f"a link to {os.readlink(path)}, {kind}" if path.is_symlink() else kind
    except OSError:  # the link changed since its stat: say what the stat saw
        return kind


def check_image_file(path: Path, st: os.stat_result, limit: int = MAX_IMAGE_BYTES) -> None:
    """Refuse, from its ``stat`` (links followed), an image file that :func:`read_image_file` would refuse.

    Raises:
        DataError: ``path`` is not a regular file, or holds more than ``limit`` bytes.
    """
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"{path} is {file_kind(Path(path), st.st_mode)}, not a regular file; "
                        "remove it or replace it with an image file.")
    if st.st_size > limit:
        raise too_large(str(path), st.st_size, limit)


def _cannot_read(path: Path, err: OSError) -> DataError:
    return DataError(f"Cannot read {path} ({err.strerror or err}); check that the file exists and is readable.")


def read_image_file(path: Path, limit: int = MAX_IMAGE_BYTES) -> bytes:
    """The bytes of one image file: a regular file (links followed) of at most ``limit`` bytes.

    The file is refused from its ``stat`` before it is opened, then opened without blocking and
    checked again on the open file (one swapped in between is refused too), and never more than
    ``limit`` + 1 bytes are read (a file that grew since is refused, not read on).

    Raises:
        DataError: the file cannot be read, is not a regular file, or holds more than ``limit`` bytes.
    """
    path = Path(path)
    try:
        check_image_file(path, os.stat(path), limit)
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as err:
        raise _cannot_read(path, err) from err
    with os.fdopen(fd, "rb") as f:
        try:
            check_image_file(path, os.fstat(fd), limit)
            data = f.read(limit + 1)
        except OSError as err:
            raise _cannot_read(path, err) from err
    if len(data) > limit:
        raise too_large(str(path), len(data), limit)
    return data
