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
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps

from sbcli.data.rgb import to_rgb
from sbcli.errors import DataError

#: Decoded pixels allowed per image unless a caller says otherwise: Pillow's own warning threshold.
DEFAULT_MAX_PIXELS = int(Image.MAX_IMAGE_PIXELS or 89_478_485)

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
