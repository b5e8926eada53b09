"""Pixels as every part of sbcli reads them: which files are images, and any Pillow mode to 8-bit RGB.

numpy and Pillow only (no torch), so that training (:mod:`sbcli.data.sources`) and serving
(:mod:`sbcli.serve.preprocess`) share one definition and cannot drift apart.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

#: File name endings (lower case) treated as images; other files are skipped.
IMAGE_EXTENSIONS = frozenset(
    ".jpg .jpeg .jpe .jfif .png .bmp .dib .gif .webp .tif .tiff .ppm .pgm .pbm .pnm .tga .ico".split()
)
SIXTEEN_BIT_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")  # gray deeper than 8 bits


def to_rgb(image: Image.Image) -> Image.Image:
    """Any Pillow mode -> 8-bit RGB: alpha dropped, gray replicated, 16-bit gray divided by 257."""
    if image.mode in SIXTEEN_BIT_MODES:
        # 16-bit (and 32-bit) grayscale: Pillow's convert would clip at 255 instead of scaling.
        scale = 1.0 if image.mode == "F" else 257.0
        gray = np.clip(np.asarray(image, dtype=np.float64) / scale, 0, 255).astype(np.uint8)
        return Image.fromarray(gray, mode="L").convert("RGB")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # Pillow warns when palette transparency goes straight to RGB
    return image.convert("RGB")
