"""Tensors in and out of the Open Inference Protocol's REST messages (KServe v2, as Triton speaks it).

Requests: a JSON object ``{"id"?, "parameters"?, "inputs": [...], "outputs"?: [...]}``, followed by
raw tensor bytes when the ``Inference-Header-Content-Length`` header says where the JSON ends (the
binary-data extension: an input with ``"parameters": {"binary_data_size": n}`` takes the next
``n`` bytes). ``FP32`` tensors are little-endian floats in row-major order; ``BYTES`` elements are
base64 strings in JSON, and 4-byte little-endian lengths followed by the bytes in binary.

Responses: outputs in JSON ``data``, or in binary (``"binary_data": true`` on an output, or
``"binary_data_output": true`` on the request) with ``binary_data_size``. The classification
extension (``"classification": k`` on an output, or on the request for every output) answers
``BYTES`` [N, k] strings ``"value:index:label"``, best first.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sbcli.serve.limits import HTTPError

HEADER = "Inference-Header-Content-Length"
MAX_ELEMENTS = 2**31  # more than any request holds: every element takes a byte or more, and --max-request-mb is at most 1024


@dataclass(frozen=True)
class Tensor:
    """One request input: FP32 as an array, BYTES as a list of byte strings."""

    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray | list[bytes]


@dataclass(frozen=True)
class Wanted:
    """One requested output: its name, binary or JSON, and a classification count (0: the tensor itself)."""

    name: str
    binary: bool
    classification: int = 0


@dataclass
class Request:
    """A parsed inference request."""

    id: str | None
    inputs: list[Tensor]
    outputs: list[Wanted] | None  # None: every output
    binary_default: bool = False
    classification: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)


def split(body: bytes, header_length: str | None) -> tuple[Any, memoryview]:
    """The JSON header (parsed) and the binary data after it."""
    if header_length is None:
        json_part, rest = body, memoryview(b"")
    else:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise HTTPError(400, f"The {HEADER} header must be a number of bytes within the body.")
        n = int(header_length)
        json_part, rest = body[:n], memoryview(body)[n:]
    try:
        return json.loads(json_part), rest
    except (ValueError, RecursionError) as err:
        raise HTTPError(400, f"The inference request is not valid JSON ({str(err)[:120]}).") from err


def count(shape: Any, name: str) -> int:
    """The elements ``shape`` holds, at most :data:`MAX_ELEMENTS`.

    The product is taken in Python's exact integers and bounded before numpy sees the shape: in int64
    it wraps around (2**62 * 3 * 32 * 32 is 0), and a shape that matches no data then fails to reshape.
    """
    if not isinstance(shape, list) or not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise HTTPError(400, f'Input "{name}" needs a "shape": a list of whole numbers.')
    count = math.prod(shape)
    if count > MAX_ELEMENTS or max(shape) > MAX_ELEMENTS:
        raise HTTPError(400, f'Input "{name}" has shape {shape}, more elements than any request to this server can hold.')
    return count


def bytes_elements(raw: memoryview, name: str) -> list[bytes]:
    """The elements of a BYTES tensor in binary: each a 4-byte little-endian length, then its bytes."""
    out, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise HTTPError(400, f'The binary data of input "{name}" ends inside a length prefix.')
        (n,) = struct.unpack_from("<I", raw, at)
        if at + 4 + n > len(raw):
            raise HTTPError(400, f'The binary data of input "{name}" ends inside an element.')
        out.append(bytes(raw[at + 4 : at + 4 + n]))
        at += 4 + n
    return out


def _b64(value: Any, name: str, index: int) -> bytes:
    if not isinstance(value, str):
        raise HTTPError(400, f'Element {index} of BYTES input "{name}" is not a base64 string.')
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as err:
        raise HTTPError(400, f'Element {index} of BYTES input "{name}" is not valid base64 ({err}).') from err


def _flatten(data: Any) -> list[Any]:
    """The leaves of nested lists in row-major order (iterative: any nesting the JSON parser accepted)."""
    out, stack = [], [iter([data])]
    while stack:
        item = next(stack[-1], stack)
        if item is stack:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        else:
            out.append(item)
    return out


def fp32_raw(name: str, shape: list[int], raw: memoryview | bytes) -> Tensor:
    """An FP32 tensor from its little-endian bytes (HTTP's binary data, gRPC's raw contents)."""
    n = count(shape, name)
    if len(raw) != 4 * n:
        raise HTTPError(400, f'Input "{name}" has {len(raw)} bytes of data; its shape {shape} needs {4 * n}.')
    return Tensor(name, "FP32", shape, np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(shape))


def fp32_values(name: str, shape: list[int], values: Any) -> Tensor:
    """An FP32 tensor from its values (JSON's nested lists, gRPC's typed contents), in row-major order."""
    n = count(shape, name)
    try:
        data = np.asarray(_flatten(values), dtype=np.float32)
    except (TypeError, ValueError) as err:
        raise HTTPError(400, f'The data of input "{name}" are not numbers.') from err
    if data.size != n:
        raise HTTPError(400, f'Input "{name}" has {data.size} values; its shape {shape} needs {n}.')
    return Tensor(name, "FP32", shape, data.reshape(shape))


def bytes_tensor(name: str, shape: list[int], items: list[bytes]) -> Tensor:
    """A BYTES tensor of ``items``, as many as its shape holds."""
    n = count(shape, name)
    if len(items) != n:
        raise HTTPError(400, f'Input "{name}" has {len(items)} elements; its shape {shape} needs {n}.')
    return Tensor(name, "BYTES", shape, items)


def refuse_datatype(name: str, datatype: Any) -> HTTPError:
    return HTTPError(400, f'Input "{name}" has datatype {datatype!r}; this model takes FP32 or BYTES.')


def _input(spec: Any, binary: memoryview, at: int) -> tuple[Tensor, int]:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise HTTPError(400, 'Every input needs a "name", a "shape", a "datatype" and "data" (or binary data).')
    name, datatype, shape = spec["name"], spec.get("datatype"), spec.get("shape")
    n = count(shape, name)
    params = spec.get("parameters") or {}
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    if datatype not in ("FP32", "BYTES"):
        raise refuse_datatype(name, datatype)
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0 or at + size > len(binary)):
        raise HTTPError(400, f'Input "{name}" says {size} binary bytes, more than the body holds.')
    if datatype == "FP32":
        if size is not None:
            if size != 4 * n:
                raise HTTPError(400, f'Input "{name}" says {size} binary bytes; its shape needs {4 * n} and the body must hold them.')
            return fp32_raw(name, shape, binary[at : at + size]), at + size
        return fp32_values(name, shape, spec.get("data")), at
    if size is not None:
        return bytes_tensor(name, shape, bytes_elements(binary[at : at + size], name)), at + size
    return bytes_tensor(name, shape, [_b64(v, name, i) for i, v in enumerate(_flatten(spec.get("data")))]), at


def _classification(params: dict, where: str) -> int:
    k = params.get("classification", 0)
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise HTTPError(400, f'"classification" {where} must be a whole number of at least 1.')
    return k


def parse(body: bytes, header_length: str | None) -> Request:
    """A request from its body (raises HTTPError 400 with one sentence when malformed)."""
    data, binary = split(body, header_length)
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), list) or not data["inputs"]:
        raise HTTPError(400, 'The inference request needs "inputs": a list of tensors.')
    params = data.get("parameters") or {}
    if not isinstance(params, dict):
        raise HTTPError(400, '"parameters" must be an object.')
    inputs, at = [], 0
    for spec in data["inputs"]:
        tensor, at = _input(spec, binary, at)
        inputs.append(tensor)
    if at != len(binary):
        raise HTTPError(400, f"The body holds {len(binary) - at} bytes of binary data that no input claims.")
    default_binary = bool(params.get("binary_data_output", False))
    outputs = None
    if data.get("outputs") is not None:
        if not isinstance(data["outputs"], list):
            raise HTTPError(400, '"outputs" must be a list of {"name": ...} objects.')
        outputs = []
        for out in data["outputs"]:
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise HTTPError(400, 'Every requested output needs a "name".')
            p = out.get("parameters") or {}
            outputs.append(Wanted(out["name"], bool(p.get("binary_data", default_binary)), _classification(p, "on an output")))
    request_id = data.get("id")
    return Request(str(request_id) if request_id is not None else None, inputs, outputs, default_binary,
                   _classification(params, "on the request"), params)


def classify(values: np.ndarray, k: int, labels: list[str]) -> np.ndarray:
    """BYTES [N, k]: ``"value:index:label"`` of the ``k`` largest values of every row, best first."""
    k = min(k, values.shape[1])
    best = np.argsort(-values, axis=1, kind="stable")[:, :k]
    rows = [[f"{values[r, i]:f}:{i}:{labels[i]}".encode() for i in row] for r, row in enumerate(best)]
    return np.array(rows, dtype=object).reshape(len(rows), k)


def _serialize_bytes(items: np.ndarray) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items.reshape(-1))


def output(name: str, values: np.ndarray, binary: bool) -> tuple[dict[str, Any], bytes]:
    """One output's JSON object and its binary data (empty when in JSON)."""
    datatype = "BYTES" if values.dtype == object else "FP32"
    out: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(values.shape)}
    if not binary:
        flat = values.reshape(-1)
        out["data"] = [b.decode() for b in flat] if datatype == "BYTES" else flat.astype(float).tolist()
        return out, b""
    raw = _serialize_bytes(values) if datatype == "BYTES" else np.ascontiguousarray(values, dtype="<f4").tobytes()
    out["parameters"] = {"binary_data_size": len(raw)}
    return out, raw


def response(header: dict[str, Any], parts: list[bytes]) -> tuple[bytes, dict[str, str], str]:
    """The response body, its extra headers and its media type."""
    text = json.dumps(header).encode()
    if not any(parts):
        return text, {}, "application/json"
    return text + b"".join(parts), {HEADER: str(len(text))}, "application/octet-stream"
