"""Content-addressed tensor bytes: what did not change between steps is stored once (format 4).

A step's tensor file (``model.safetensors``, ``memory.safetensors``, ``test-sample.safetensors``) keeps
its small tensors inline. A tensor of at least :data:`MIN_BYTES` is cut along its first dimension into
blocks of whole rows of at most :data:`BLOCK_BYTES` each, and every block is written once as
``objects/<sha256>``, named by the SHA-256 of its bytes. The step file's safetensors metadata
(``__metadata__["sbcli.objects"]``, a JSON text) lists such a tensor's dtype, shape and its blocks in
order::

    {"ranpac.projection": {"dtype": "F32", "shape": [256, 2000], "parts": ["9f2c...", "04ab..."]}}

So an unchanged tensor (a frozen backbone's weights, a random projection) is the same blocks at every
step, and a tensor that only grows at its end (the carried test sample: earlier tasks' images, then
the new task's) re-stores only its last, partial block and the new rows. The step file is hashed in
``learner.json`` as before, so the metadata (which blocks make a tensor) is vouched for; each block
is vouched for by its own name, checked as it is read.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save as safetensors_bytes

from sbcli.learner.validate.fields import damaged
from sbcli.learner.validate.tensors import MAX_DIMS, SAFETENSORS_DTYPES, parse_safetensors

OBJECTS_DIR = "objects"
METADATA_KEY = "sbcli.objects"
MIN_BYTES = 256 << 10  # smaller tensors (biases, norms, a small head) stay in the step's file
BLOCK_BYTES = 4 << 20  # blocks of whole rows up to this size: appended rows leave earlier blocks unchanged
MAX_PARTS = 1 << 20
HEX64 = re.compile(r"[0-9a-f]{64}")
DTYPE_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


def object_path(sha256: str) -> str:
    """The path of a block relative to the learner."""
    return f"{OBJECTS_DIR}/{sha256}"


@dataclass(frozen=True)
class Split:
    """A tensor file as a save writes it: its own bytes and the blocks it names (SHA-256 -> bytes)."""

    data: bytes
    blocks: dict[str, bytes]


def split(tensors: dict[str, torch.Tensor], cuts: dict[str, list[int]] | None = None) -> Split:
    """The step file of ``tensors``, its large tensors moved into content-addressed blocks.

    ``cuts``: for a tensor name, the rows where a new block must begin (e.g. where the images of the next
    class start), so that rows appended at a later step, or another class's rows, never change a block.
    """
    inline: dict[str, torch.Tensor] = {}
    external: dict[str, dict] = {}
    blocks: dict[str, bytes] = {}
    for name, value in tensors.items():
        value = value.detach().cpu().contiguous()
        nbytes = value.numel() * value.element_size()
        if nbytes < MIN_BYTES or value.dim() == 0 or value.dtype not in DTYPE_NAMES:
            inline[name] = value
            continue
        raw = value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b""
        parts = []
        for begin, end in _spans(value.shape[0], nbytes // value.shape[0], (cuts or {}).get(name, [])):
            chunk = raw[begin:end]
            digest = hashlib.sha256(chunk).hexdigest()
            blocks.setdefault(digest, chunk)
            parts.append(digest)
        external[name] = {"dtype": DTYPE_NAMES[value.dtype], "shape": list(value.shape), "parts": parts}
    metadata = {METADATA_KEY: json.dumps(external, sort_keys=True)} if external else None
    return Split(safetensors_bytes(inline, metadata=metadata), blocks)


def _spans(rows: int, row_bytes: int, cuts: list[int]) -> list[tuple[int, int]]:
    """Byte spans of whole rows: a new span at every cut, and at most :data:`BLOCK_BYTES` per span."""
    per_block = max(1, BLOCK_BYTES // max(row_bytes, 1))
    bounds = sorted({0, rows, *(c for c in cuts if 0 < c < rows)})
    spans = []
    for first, last in zip(bounds, bounds[1:]):
        for row in range(first, last, per_block):
            spans.append((row * row_bytes, min(row + per_block, last) * row_bytes))
    return spans


def class_cuts(labels: torch.Tensor) -> list[int]:
    """The rows where the label changes: images kept per class (exemplars, a test sample) cut there."""
    if labels.numel() < 2:
        return []
    return (torch.nonzero(labels[1:] != labels[:-1]).flatten() + 1).tolist()


@dataclass(frozen=True)
class Ref:
    """A tensor stored as blocks: its dtype, shape and the SHA-256 of each block in order."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    parts: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def refs(raw: bytes | bytearray, path: Path) -> dict[str, Ref]:
    """The tensors a step file stores as blocks (its checked ``sbcli.objects`` metadata); {} when none.

    Raises:
        LearnerError: malformed metadata (one sentence naming the file).
    """
    if len(raw) < 8:
        return {}  # parse_safetensors names what is wrong with such a file
    (length,) = struct.unpack("<Q", bytes(raw[:8]))
    try:
        header = json.loads(bytes(raw[8:8 + length]).decode("utf-8"))
        text = header.get("__metadata__", {}).get(METADATA_KEY) if isinstance(header, dict) else None
    except (UnicodeDecodeError, ValueError, RecursionError, AttributeError):
        return {}  # parse_safetensors refuses it
    if text is None:
        return {}
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise damaged(path, f"its {METADATA_KEY} metadata is not a JSON object")
    return {name: _ref(name, entry, path) for name, entry in value.items()}


def _ref(name: str, entry: object, path: Path) -> Ref:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "parts"}:
        raise damaged(path, f"the stored blocks of {name!r} are not described by dtype, shape and parts")
    dtype = SAFETENSORS_DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    shape, parts = entry["shape"], entry["parts"]
    if dtype is None or not isinstance(shape, list) or not 1 <= len(shape) <= MAX_DIMS or not all(
            type(d) is int and 0 <= d < 1 << 40 for d in shape):
        raise damaged(path, f"the stored blocks of {name!r} have a malformed dtype or shape")
    if not isinstance(parts, list) or len(parts) > MAX_PARTS or not all(
            isinstance(p, str) and HEX64.fullmatch(p) for p in parts):
        raise damaged(path, f"the stored blocks of {name!r} are not a list of SHA-256 names")
    return Ref(dtype, tuple(shape), tuple(parts))


def assemble(raw: bytes | bytearray, path: Path, block: Callable[[str], bytearray]) -> dict[str, torch.Tensor]:
    """The tensors of a step file: its inline ones and those made of blocks (``block(sha256)``: the verified bytes).

    Raises:
        LearnerError: malformed file or metadata, blocks whose sizes do not make the tensor's shape, a
            name stored both inline and as blocks.
    """
    tensors = parse_safetensors(raw, path)
    for name, ref in refs(raw, path).items():
        if name in tensors:
            raise damaged(path, f"{name!r} is stored both in the file and as blocks")
        chunks = [block(sha) for sha in ref.parts]
        total = sum(len(c) for c in chunks)
        if total != ref.nbytes:
            raise damaged(path, f"the blocks of {name!r} hold {total} bytes, its shape needs {ref.nbytes}")
        if not chunks or total == 0:
            tensors[name] = torch.empty(ref.shape, dtype=ref.dtype)
            continue
        data = chunks[0] if len(chunks) == 1 else bytearray().join(chunks)
        tensors[name] = torch.frombuffer(data, dtype=ref.dtype).reshape(ref.shape)
    return tensors


