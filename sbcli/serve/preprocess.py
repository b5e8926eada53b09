"""Image bytes -> model input, exactly as the ONNX metadata's ``preprocess`` key says (numpy + Pillow).

The key holds strict JSON (format 2 of sbcli's metadata)::

    {"decode": {"exif_orientation": "apply", "jpeg_reduced_decode": false, "mode": "RGB",
                "alpha": "drop", "gray": "replicate", "sixteen_bit": "divide_by_257"},
     "resize": {"width": 32, "height": 32, "filter": "bilinear", "antialias": true,
                "keep_aspect_ratio": false, "reference": "Pillow Image.resize"},
     "channel_order": "RGB", "layout": "NCHW", "dtype": "float32", "divide_by": 255.0,
     "normalization": {"mean": [...], "std": [...], "where": "inside_graph"}}

In words: decode the whole image (no reduced-size JPEG decoding), apply the EXIF orientation,
convert to 8-bit RGB (alpha dropped, not composited; gray replicated; 16-bit gray divided by 257),
resize to width x height with Pillow's bilinear filter (which widens its support when shrinking,
i.e. antialiased) when the size differs, lay out as [3, H, W], divide by 255. The normalisation is
inside the graph, so a client never applies it.

Files exported before format 2 carry no ``preprocess`` key; they were served with reduced-size
JPEG decoding (Pillow's ``draft``) and then the same bilinear resize, and :func:`from_metadata`
gives exactly that (``jpeg_reduced_decode`` true), so their answers do not change.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from sbcli.data.rgb import IMAGE_EXTENSIONS, to_rgb  # noqa: F401  (IMAGE_EXTENSIONS: serve.predict reads it here)
from sbcli.errors import DataError, ExportError

FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


@dataclass(frozen=True)
class Preprocess:
    """How image bytes become one [3, height, width] float32 input in [0, 1]."""

    width: int
    height: int
    filter: str = "bilinear"
    jpeg_reduced_decode: bool = False  # Pillow's draft mode: only files exported before format 2
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

    def decode(self, data: bytes, name: str = "image") -> np.ndarray:
        """uint8 [3, height, width] of one encoded image.

        Raises:
            DataError: Pillow cannot decode ``data`` (the message names ``name``).
        """
        try:
            with Image.open(io.BytesIO(data)) as image:
                if self.jpeg_reduced_decode:
                    image.draft(None, (self.width, self.height))
                rgb = to_rgb(ImageOps.exif_transpose(image))
            if rgb.size != (self.width, self.height):
                rgb = rgb.resize((self.width, self.height), FILTERS[self.filter])
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
            reason = "not an image format Pillow reads" if isinstance(err, UnidentifiedImageError) else str(err)
            raise DataError(f"Cannot decode image {name} ({reason}); send a JPEG, PNG or other image Pillow reads.") from err
        return np.asarray(rgb).transpose(2, 0, 1)

    @staticmethod
    def to_input(images: list[np.ndarray] | np.ndarray) -> np.ndarray:
        """uint8 [N, 3, H, W] (or a list of [3, H, W]) -> float32 in [0, 1], the model's input."""
        return np.ascontiguousarray(np.stack(images) if isinstance(images, list) else images, dtype=np.float32) / 255.0


def for_model(image_size: int, normalization: Mapping[str, Any]) -> Preprocess:
    """The preprocessing that ``sb export`` records for a learner of this size and normalisation."""
    return Preprocess(image_size, image_size, "bilinear", False, tuple(normalization["mean"]), tuple(normalization["std"]))


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
