"""Image bytes -> model input, exactly as the ONNX metadata's ``preprocess`` key says (numpy + Pillow).

The key holds strict JSON (format 2 of sbcli's metadata)::

    {"decode": {"exif_orientation": "apply", "jpeg_reduced_decode": true, "mode": "RGB",
                "alpha": "drop", "gray": "replicate", "sixteen_bit": "divide_by_257"},
     "resize": {"width": 32, "height": 32, "filter": "bilinear", "antialias": true,
                "keep_aspect_ratio": false, "reference": "Pillow Image.resize"},
     "channel_order": "RGB", "layout": "NCHW", "dtype": "float32", "divide_by": 255.0,
     "normalization": {"mean": [...], "std": [...], "where": "inside_graph"}}

In words: open the image; a JPEG decodes at the smallest of 1/1, 1/2, 1/4, 1/8 scale that still
covers width x height (Pillow's ``draft``, libjpeg's DCT scaling: ``jpeg_reduced_decode``), apply
the EXIF orientation, convert to 8-bit RGB (alpha dropped, not composited; gray replicated; 16-bit
gray divided by 257), resize to width x height with Pillow's bilinear filter (which widens its
support when shrinking, i.e. antialiased) when the size differs, lay out as [3, H, W], divide by
255. The normalisation is inside the graph, so a client never applies it. This is exactly how
training decodes (:func:`sbcli.data.pixels.decode`, one function for both).

Format-2 files exported before this version say ``"jpeg_reduced_decode": false`` (the whole JPEG
decoded, then resized) and are served as they say; files before format 2 carry no ``preprocess``
key and were served with reduced-size decoding, which :func:`from_metadata` keeps.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import UnidentifiedImageError

from sbcli.data import pixels
from sbcli.data.pixels import FILTERS
from sbcli.data.rgb import IMAGE_EXTENSIONS  # noqa: F401  (serve.predict reads it here)
from sbcli.errors import DataError, ExportError


@dataclass(frozen=True)
class Preprocess:
    """How image bytes become one [3, height, width] float32 input in [0, 1]."""

    width: int
    height: int
    filter: str = "bilinear"
    jpeg_reduced_decode: bool = True  # Pillow's draft mode, as training decodes (false in some format-2 files)
    mean: tuple[float, ...] = field(default=(0.0, 0.0, 0.0))  # applied inside the graph (for the record)
    std: tuple[float, ...] = field(default=(1.0, 1.0, 1.0))

    def to_json(self) -> dict[str, Any]:
        """The strict-JSON description stored in the metadata's ``preprocess`` key."""
        return {
            "decode": {"exif_orientation": "apply", "jpeg_reduced_decode": self.jpeg_reduced_decode, "mode": "RGB",
                       "alpha": "drop", "gray": "replicate", "sixteen_bit": "divide_by_257"},
            "resize": {"width": self.width, "height": self.height, "filter": self.filter, "antialias": True,
                       "keep_aspect_ratio": False, "reference": "Pillow Image.resize"},
            "channel_order": "RGB",
            "layout": "NCHW",
            "dtype": "float32",
            "divide_by": 255.0,
            "normalization": {"mean": list(self.mean), "std": list(self.std), "where": "inside_graph"},
        }

    def decode(self, data: bytes, name: str = "image", max_pixels: int = pixels.DEFAULT_MAX_PIXELS) -> np.ndarray:
        """uint8 [3, height, width] of one encoded image (:func:`sbcli.data.pixels.decode`, as training decodes).

        Raises:
            ImageTooLargeError: it would decode to more than ``max_pixels`` pixels (checked before decoding).
            DataError: Pillow cannot decode ``data`` (the message names ``name``).
        """
        try:
            return pixels.decode(data, self.width, self.height, draft=self.jpeg_reduced_decode, filter=self.filter,
                                 max_pixels=max_pixels, name=name)
        except (OSError, SyntaxError, ValueError) as err:
            raise _undecodable(name, err) from err

    def decoded_pixels(self, data: bytes, name: str = "image", max_pixels: int = pixels.DEFAULT_MAX_PIXELS) -> int:
        """How many pixels :meth:`decode` would decode, from the header alone (nothing is decoded).

        Raises:
            ImageTooLargeError: Pillow's own decompression-bomb check refuses the header.
            DataError: Pillow cannot read the header.
        """
        try:
            width, height = pixels.decoded_size(data, self.width, self.height, draft=self.jpeg_reduced_decode,
                                                name=name, max_pixels=max_pixels)
        except (OSError, SyntaxError, ValueError) as err:
            raise _undecodable(name, err) from err
        return width * height

    @staticmethod
    def to_input(images: list[np.ndarray] | np.ndarray) -> np.ndarray:
        """uint8 [N, 3, H, W] (or a list of [3, H, W]) -> float32 in [0, 1], the model's input."""
        return np.ascontiguousarray(np.stack(images) if isinstance(images, list) else images, dtype=np.float32) / 255.0


def _undecodable(name: str, err: Exception) -> DataError:
    reason = "not an image format Pillow reads" if isinstance(err, UnidentifiedImageError) else str(err)
    return DataError(f"Cannot decode image {name} ({reason}); send a JPEG, PNG or other image Pillow reads.")


def for_model(image_size: int, mean: Sequence[float], std: Sequence[float]) -> Preprocess:
    """The preprocessing that ``sb export`` records for a learner of this size and normalisation."""
    return Preprocess(image_size, image_size, "bilinear", True, tuple(mean), tuple(std))


def from_metadata(meta: Mapping[str, str], source: str) -> Preprocess:
    """The preprocessing of an sbcli ONNX file, from its metadata alone.

    Raises:
        ExportError: the ``preprocess`` key is not the strict JSON this version reads.
    """
    if "preprocess" not in meta:  # format 1: draft-mode decoding, bilinear resize to input_size
        _, height, width = json.loads(meta["input_size"])
        return Preprocess(int(width), int(height), "bilinear", True)
    try:
        spec = json.loads(meta["preprocess"])
        resize, decode, norm = spec["resize"], spec["decode"], spec["normalization"]
        out = Preprocess(int(resize["width"]), int(resize["height"]), str(resize["filter"]),
                         bool(decode["jpeg_reduced_decode"]), tuple(norm["mean"]), tuple(norm["std"]))
        known = (spec["channel_order"], spec["layout"], spec["dtype"], float(spec["divide_by"]), out.filter in FILTERS)
    except (ValueError, KeyError, TypeError) as err:
        raise ExportError(f"{source} has a 'preprocess' metadata entry this sbcli cannot read ({err!r}); "
                          "export it again with this version of sbcli.") from err
    if known != ("RGB", "NCHW", "float32", 255.0, True):
        raise ExportError(f"{source} asks for preprocessing this sbcli does not implement ({json.dumps(spec)[:200]}); "
                          "upgrade sbcli or export it again.")
    return out
