"""Learner tensor files checked at load: safetensors read without trust, then the tensors themselves.

* :func:`read_safetensors` (:func:`parse_safetensors` for bytes already read): a safetensors file
  read without trusting it: the header length is bounded, every offset lies inside the file and the
  tensors tile the data exactly, dtypes come from a whitelist. Nothing is allocated beyond the file's own size.
* :func:`check_model_tensors`: the weights the learner's network has (names, shapes, float32 with
  int64 BatchNorm counters), all finite; compared against the network built on the ``meta``
  device, so that nothing is allocated before the file is known to fit.
* :func:`check_memory_tensors`: exemplar images uint8 at the training size, int64 labels in range.

Each failure raises :class:`~sbcli.errors.LearnerError` naming the file and what is wrong.
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
from sbcli.learner.validate.fields import damaged, found

MAX_HEADER_BYTES = 16 << 20  # a safetensors header of a learner is a few KiB
MAX_DIMS = 8

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
EXTRA_PREFIX = "extra."  # a method's own tensors in model.safetensors: "extra." + name (checked here, written by the state)


# -- safetensors ------------------------------------------------------------------------------


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
            raw = f.read(size)
    except FileNotFoundError:
        raise  # a reader that lost a race with a writer's commit reads learner.json again (sbcli.learner.state)
    except OSError as err:
        raise LearnerError(f"Could not read {path} ({err.strerror or err}); check its permissions.") from err
    if len(raw) != size:
        raise damaged(path, "it changed while it was being read")
    return parse_safetensors(raw, path)


def parse_safetensors(raw: bytes | bytearray, path: Path | str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file's bytes (already read, e.g. checked against its hash), not trusted.

    Raises:
        LearnerError: the header, offsets or dtypes are malformed (naming ``path``).
    """
    view = memoryview(raw)
    header, start = _parse_header(view, len(raw), path)
    data = view[start:]
    entries = _entries(header, len(data), path)
    tensors: dict[str, torch.Tensor] = {}
    for name, (dtype, shape, begin, end) in entries.items():
        if begin == end:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            tensors[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(shape)
    return tensors


def _parse_header(raw: memoryview, size: int, path: Path | str) -> tuple[dict, int]:
    if size < 8:
        raise damaged(path, f"it is {size} bytes long, too short for a safetensors file")
    (length,) = struct.unpack("<Q", raw[:8])
    if length > MAX_HEADER_BYTES or 8 + length > size:
        raise damaged(path, f"its header claims {length} bytes but the file has {size} (truncated or not safetensors)")
    try:
        header = json.loads(bytes(raw[8 : 8 + length]).decode("utf-8"))
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


# -- tensors against learner.json -------------------------------------------------------------


def check_model_tensors(tensors: dict[str, torch.Tensor], state: Any, where: Path | str) -> None:
    """The network's weights as the learner's architecture has them: names, shapes, dtypes, finite.

    Method state (``extra.*``) must be float32, float64 (a ridge head's running sums) or int64 and finite. The expected weights come
    from the network built on the ``meta`` device, so nothing is allocated here.

    Raises:
        LearnerError: a missing, unexpected, misshaped, non-float32 or non-finite tensor.
    """
    from sbcli.nets.meta import meta_model

    expected = meta_model(state.arch, state.num_classes, state.width).state_dict()
    weights = {k: v for k, v in tensors.items() if not k.startswith(EXTRA_PREFIX)}
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or unexpected:
        what = f"the weight {missing[0]} is missing" if missing else f"it has the unknown weight {unexpected[0]}"
        raise damaged(where, f"{what} for a {state.arch} of width {state.width} with {state.num_classes} classes")
    for name, want in expected.items():
        got = weights[name]
        if got.dtype != want.dtype:
            raise damaged(where, f"{name} is stored as {_dtype(got.dtype)}, not {_dtype(want.dtype)}")
        if tuple(got.shape) != tuple(want.shape):
            raise damaged(where, f"{name} has shape {list(got.shape)}, the network needs {list(want.shape)}")
    for name, value in tensors.items():
        if name.startswith(EXTRA_PREFIX) and value.dtype not in (torch.float32, torch.float64, torch.int64):
            raise damaged(where, f"{name} is stored as {_dtype(value.dtype)}, not float32, float64 or int64")
        _check_finite(name, value, where)


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_finite(name: str, value: torch.Tensor, where: Path | str) -> None:
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise damaged(where, f"{name} holds NaN or infinite values")


def check_memory_tensors(tensors: dict[str, torch.Tensor], state: Any, where: Path | str) -> None:
    """Exemplars: uint8 images [M, 3, S, S] at the learner's image size, int64 labels [M] of known classes.

    Raises:
        LearnerError: missing or extra tensors, wrong dtypes or shapes, labels out of range, or
            more exemplars than the learner's budget.
    """
    if set(tensors) != {"images", "labels"}:
        names = ", ".join(sorted(tensors)) or "nothing"
        raise damaged(where, f"it must hold images and labels, it holds {names}")
    images, labels = tensors["images"], tensors["labels"]
    if images.dtype != torch.uint8:
        raise damaged(where, f"the exemplar images are {_dtype(images.dtype)}, not uint8")
    if labels.dtype != torch.int64:
        raise damaged(where, f"the exemplar labels are {_dtype(labels.dtype)}, not int64")
    count, size = labels.shape[0] if labels.dim() == 1 else -1, state.image_size
    if labels.dim() != 1 or images.dim() != 4 or images.shape[0] != count or images.shape[1] != 3:
        raise damaged(where, f"images {list(images.shape)} and labels {list(labels.shape)} are not [M, 3, H, W] and [M]")
    if count and tuple(images.shape[2:]) != (size, size):
        raise damaged(where, f"the exemplar images are {images.shape[2]}x{images.shape[3]}, the learner's are {size}x{size}")
    budget = state.memory.budget
    if count > budget:
        raise damaged(where, f"it holds {count} exemplars, more than the learner's budget of {budget}")
    if count and (int(labels.min()) < 0 or int(labels.max()) >= state.num_classes):
        raise damaged(where, f"an exemplar label lies outside 0..{state.num_classes - 1}")
