"""Reading a safetensors file without trusting it: what :func:`sbcli.validate.read_safetensors` is.

The header length is bounded (``MAX_HEADER_BYTES``) and must lie inside the file, the header must
be a JSON object, every dtype comes from a whitelist, every tensor's byte span must match its shape
and dtype, and the spans must tile the data exactly (no overlap, no hole, nothing past the end).
Nothing is allocated beyond the file's own size. A malformed file is one
:class:`~sbcli.errors.LearnerError` sentence; a missing file stays a ``FileNotFoundError``.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import torch

from sbcli.errors import LearnerError

MAX_HEADER_BYTES = 16 << 20  # a safetensors header of a learner is a few KiB
MAX_DIMS = 8

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
RESTORE = "restore the learner from a copy or pull it again"


def damaged(where: Path | str, problem: str) -> LearnerError:
    """The one sentence for a damaged learner file."""
    return LearnerError(f"{where} is damaged: {problem}; {RESTORE}.")


def found(value: Any) -> str:
    """A short description of a JSON value for a message: ``a string "1"``, ``a list``, ``1000000.0``."""
    kind = {bool: "true/false", str: "a string", list: "a list", dict: "an object", type(None): "null"}.get(type(value))
    text = json.dumps(value, allow_nan=True) if not isinstance(value, (list, dict)) else ""
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{kind} {text}".strip() if kind else text


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file without trusting it; tensors on the CPU.

    Raises:
        LearnerError: the file cannot be read, or its header, offsets or dtypes are malformed.
        FileNotFoundError: the file is not there (the caller knows what that means for a learner).
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            header, start = _read_header(f, size, path)
            data = f.read(size - start)
    except FileNotFoundError:
        raise  # a reader that lost a race with a writer's commit reads learner.json again (sbcli.learner)
    except OSError as err:
        raise LearnerError(f"Could not read {path} ({err.strerror or err}); check its permissions.") from err
    if len(data) != size - start:
        raise damaged(path, "it changed while it was being read")
    entries = _entries(header, len(data), path)
    tensors: dict[str, torch.Tensor] = {}
    for name, (dtype, shape, begin, end) in entries.items():
        if begin == end:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            tensors[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(shape)
    return tensors


def _read_header(f: Any, size: int, path: Path) -> tuple[dict, int]:
    head = f.read(8)
    if len(head) < 8:
        raise damaged(path, f"it is {size} bytes long, too short for a safetensors file")
    (length,) = struct.unpack("<Q", head)
    if length > MAX_HEADER_BYTES or 8 + length > size:
        raise damaged(path, f"its header claims {length} bytes but the file has {size} (truncated or not safetensors)")
    raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise damaged(path, "its header is not valid JSON (truncated or not safetensors)") from err
    if not isinstance(header, dict):
        raise damaged(path, "its header is not a JSON object")
    return header, 8 + length


def _entries(header: dict, data_len: int, path: Path) -> dict[str, tuple[torch.dtype, list[int], int, int]]:
    """Name -> (dtype, shape, begin, end), checked: known dtypes, sizes that match, an exact tiling of the data."""
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise damaged(path, "its __metadata__ is not a map of strings")
            continue
        entries[name] = _entry(name, info, path)
    spans = sorted((begin, end, name) for name, (_, _, begin, end) in entries.items())
    position = 0
    for begin, end, name in spans:
        if begin != position:
            raise damaged(path, f"the bytes of {name!r} start at {begin}, expected {position} (overlap or hole)")
        position = end
    if position != data_len:
        raise damaged(path, f"its tensors cover {position} bytes of the {data_len} the file holds")
    return entries


def _entry(name: str, info: object, path: Path) -> tuple[torch.dtype, list[int], int, int]:
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise damaged(path, f"the header entry of {name!r} is not dtype, shape and data_offsets")
    dtype = SAFETENSORS_DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if dtype is None:
        raise damaged(path, f"{name!r} has the unknown dtype {found(info['dtype'])}")
    shape, offsets = info["shape"], info["data_offsets"]
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_whole(d) for d in shape):
        raise damaged(path, f"{name!r} has the malformed shape {found(shape)}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_whole(o) for o in offsets) \
            or offsets[0] > offsets[1]:
        raise damaged(path, f"{name!r} has the malformed data_offsets {found(offsets)}")
    numel = math.prod(shape)
    if numel * dtype.itemsize != offsets[1] - offsets[0]:
        raise damaged(path, f"{name!r} is {shape} of {info['dtype']} but spans {offsets[1] - offsets[0]} bytes")
    return dtype, shape, offsets[0], offsets[1]


def _whole(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62
