"""Every learner file is checked at load, before any work: one sentence for anything malformed.

A learner may come from anywhere (a pull, a copy, a crafted file), so nothing in it is trusted:

* :func:`read_json` and :func:`check_state_json`: ``learner.json`` is UTF-8 JSON, an object, with
  a whole-number ``format_version`` and the JSON type and bounds of every field
  (``width <= MAX_WIDTH``, ``image_size <= MAX_IMAGE_SIZE``, ``MAX_CLASSES`` classes ...), so that a
  crafted file cannot make sbcli allocate gigabytes.
* :func:`read_safetensors`: a safetensors file read without trusting it: the header length is
  bounded, every offset lies inside the file and the tensors tile the data exactly, dtypes come
  from a whitelist. Nothing is allocated beyond the file's own size.
* :func:`check_model_tensors`: the weights the learner's network has (names, shapes, float32 with
  int64 BatchNorm counters), all finite; compared against the network built on the ``meta``
  device, so that nothing is allocated before the file is known to fit.
* :func:`check_memory_tensors`: exemplar images uint8 at the training size, int64 labels in range.

Each failure raises :class:`~sbcli.errors.LearnerError` naming the file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from sbcli.errors import LearnerError

MAX_WIDTH = 4.0  # ResNet-18 at width 4: 180 M parameters (the paper uses 1.0)
MAX_IMAGE_SIZE = 512
MAX_CLASSES = 100_000
MAX_BUDGET = 10_000_000
MAX_EPOCHS = 1_000_000
MAX_BATCH = 1 << 20
MAX_SEED = 1 << 40  # seed * 1000 + step must stay a valid torch seed
MAX_HEADER_BYTES = 16 << 20  # a safetensors header of a learner is a few KiB
MAX_DIMS = 8

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
RESTORE = "restore the learner from a copy or pull it again"
EXTRA_PREFIX = "extra."

Check = Callable[[Any], str | None]  # a value -> None when it is fine, else what is wrong with it


def _damaged(where: Path | str, problem: str) -> LearnerError:
    return LearnerError(f"{where} is damaged: {problem}; {RESTORE}.")


# -- learner.json -----------------------------------------------------------------------------


def read_json(path: Path) -> object:
    """The JSON value in ``path``. Raises LearnerError (one sentence) when unreadable or not UTF-8 JSON."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
        return json.loads(text)
    except OSError as err:
        raise LearnerError(f"Could not read {path} ({err.strerror or err}); check its permissions.") from err
    except UnicodeDecodeError as err:
        raise _damaged(path, f"it is not UTF-8 text (byte {err.start})") from err
    except (ValueError, RecursionError) as err:  # JSONDecodeError, too many digits, nesting too deep
        raise _damaged(path, f"it is not valid JSON ({str(err).splitlines()[0][:120]})") from err


def _found(value: Any) -> str:
    kind = {bool: "true/false", str: "a string", list: "a list", dict: "an object", type(None): "null"}.get(type(value))
    text = json.dumps(value, allow_nan=True) if not isinstance(value, (list, dict)) else ""
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{kind} {text}".strip() if kind else text


def check_format_version(data: object, where: Path | str) -> int:
    """The learner's ``format_version`` (a whole number >= 1), after checking ``data`` is an object."""
    if not isinstance(data, dict):
        raise _damaged(where, f"it holds {_found(data)}, not a JSON object")
    version = data.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version < 1 << 31:
        raise _damaged(where, f"format_version must be a whole number such as 1, found {_found(version)}")
    return version


def _join(name: str, problem: str) -> str:
    """``name`` and what is wrong below it: ``tasks`` + ``[0].source must be ...``."""
    return f"{name}{'' if problem.startswith(('.', '[')) else ' '}{problem}"


def _int(lo: int, hi: int) -> Check:
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            return f"must be a whole number from {lo} to {hi}, found {_found(v)}"
        return None
    return check


def _number(lo: float, hi: float, *, lo_open: bool = False, nan: bool = False) -> Check:
    def check(v: Any) -> str | None:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if nan and isinstance(v, float) and math.isnan(v):
                return None
            if math.isfinite(v) and (lo < v if lo_open else lo <= v) and v <= hi:
                return None
        side = "above" if lo_open else "from"
        return f"must be a number {side} {lo} up to {hi}, found {_found(v)}"
    return check


def _str(choices: Callable[[], list[str]] | tuple[str, ...] | None = None, max_len: int = 4096) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, str) or len(v) > max_len:
            return f"must be a string, found {_found(v)}"
        allowed = choices() if callable(choices) else choices
        if allowed is not None and v not in allowed:
            return f"must be one of {', '.join(allowed)}, found {_found(v)}"
        return None
    return check


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"must be true or false, found {_found(v)}"


def _any_object(v: Any) -> str | None:
    return None if isinstance(v, dict) else f"must be a JSON object, found {_found(v)}"


def _optional(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


def _list(item: Check, max_len: int, min_len: int = 0) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, list) or not min_len <= len(v) <= max_len:
            return f"must be a list of {min_len} to {max_len} items, found {_found(v)}"
        for i, x in enumerate(v):
            problem = item(x)
            if problem:
                return _join(f"[{i}]", problem)
        return None
    return check


def _object(fields: dict[str, Check], required: tuple[str, ...] = (), *, closed: bool = False) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, dict):
            return f"must be a JSON object, found {_found(v)}"
        missing = [k for k in required if k not in v]
        if missing:
            return f".{missing[0]} is missing"
        if closed:
            unknown = sorted(set(v) - set(fields))
            if unknown:
                return f".{unknown[0]} is not a known setting (known: {', '.join(fields)})"
        for key, sub in fields.items():
            if key in v:
                problem = sub(v[key])
                if problem:
                    return _join(f".{key}", problem)
        return None
    return check


def _like_default(default: Any) -> Check:
    """A check for a config field that has no dedicated one: the JSON type of its default."""
    if isinstance(default, bool):
        return _bool
    if isinstance(default, int):
        return _int(-(1 << 53), 1 << 53)
    if isinstance(default, float):
        return _number(-1e300, 1e300)
    if isinstance(default, str):
        return _str(max_len=256)
    if isinstance(default, tuple):
        return _list(_number(-1e300, 1e300), 1000)
    scalar = (type(None), bool, int, float, str)
    return lambda v: None if isinstance(v, scalar) else f"must be a number, string or null, found {_found(v)}"


def _like_annotation(annotation: object) -> Check | None:
    """A check for an optional field (default None) from its annotation, e.g. ``int | None``."""
    text = str(annotation)
    for name, check in (("float", _number(-1e300, 1e300)), ("int", _int(-(1 << 53), 1 << 53)), ("bool", _bool),
                        ("str", _str(max_len=256))):
        if name in text:
            return _optional(check)
    return None


def _config(cls: Any, known: dict[str, Check]) -> Check:
    """A dataclass config stored as a JSON object: only its own fields, each of its type."""
    fields = {}
    for f in dataclasses.fields(cls):
        default = _default_of(f)
        fields[f.name] = known.get(f.name) or (_like_annotation(f.type) if default is None else None) \
            or _like_default(default)
    return _object(fields, closed=True)


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


SOURCE_KINDS = ("demo", "cifar10", "cifar100", "tiny-imagenet", "folder")  # sbcli.data.catalog's, without its imports


def _source(v: Any) -> str | None:
    """A data source record (names and fingerprints: sbcli.data.records), or a format-1 spec with paths."""
    from sbcli.data.records import is_record, record_problem

    kinds = SOURCE_KINDS
    if is_record(v):
        problem = _str(kinds)(v["kind"])
        return _join(".kind", problem) if problem else _strip(record_problem(v, MAX_CLASSES))
    fields = {"kind": _str(kinds), "path": _str(), "root": _str(), "test": _str(), "download": _bool,
              "image_size": _int(1, MAX_IMAGE_SIZE)}
    problem = _object(fields, ("kind",))(v)
    if problem:
        return problem
    needs = {"folder": ("path", "image_size"), "tiny-imagenet": ("path",), "cifar10": ("root",), "cifar100": ("root",)}
    missing = [k for k in needs.get(v["kind"], ()) if k not in v]
    return f".{missing[0]} is missing" if missing else None


def _strip(problem: str | None) -> str | None:
    return None if problem is None else problem.lstrip()


def _train_config() -> Check:
    from sbcli.engine import PRECISIONS, TrainConfig

    known = {"epochs": _int(1, MAX_EPOCHS), "batch_size": _int(1, MAX_BATCH), "eval_batch_size": _int(1, MAX_BATCH),
             "lr": _number(0, 1e6), "momentum": _number(0, 1), "weight_decay": _number(0, 1e6),
             "milestones": _list(_number(0, 1), 1000), "lr_decay": _number(0, 1e6), "compile": _bool,
             "precision": _str(tuple(PRECISIONS)), "threads": _optional(_int(1, 1024))}
    return _config(TrainConfig, known)


def _method_config(method: str) -> Check:
    from sbcli.methods import METHODS

    return _config(METHODS.get(method).config, {})


def _state_fields() -> dict[str, Check]:
    from sbcli.memory import SELECTIONS
    from sbcli.methods import METHODS
    from sbcli.nets import list_models

    three = _list(_number(-1e6, 1e6), 3, 3)
    metrics = _object({"overall": _number(0, 100, nan=True), "per_task": _list(_number(0, 100, nan=True), MAX_CLASSES)},
                      ("overall", "per_task"))
    return {
        "arch": _str(list_models), "width": _number(0, MAX_WIDTH, lo_open=True),
        "image_size": _int(1, MAX_IMAGE_SIZE),
        "normalization": _object({"mean": three, "std": _list(_number(0, 1e6, lo_open=True), 3, 3)}, ("mean", "std")),
        "method": _str(METHODS.names), "method_config": _any_object, "train_config": _train_config(),
        "memory": _object({"budget": _int(0, MAX_BUDGET), "selection": _str(SELECTIONS), "seed": _int(-MAX_SEED, MAX_SEED)},
                          ("budget",), closed=True),
        "seed": _int(-MAX_SEED, MAX_SEED),
        "class_names": _list(_str(max_len=1000), MAX_CLASSES, 1),
        "class_task": _list(_int(0, MAX_CLASSES), MAX_CLASSES, 1),
        "tasks": _list(_object({"classes": _list(_str(max_len=1000), MAX_CLASSES, 1), "source": _source},
                               ("classes", "source")), MAX_CLASSES),
        "history": _list(_object({"metrics": metrics}, ("metrics",)), MAX_CLASSES),
        "plan": _optional(_object({"source": _source, "scenario": _object({
            "order": _list(_int(0, MAX_CLASSES), MAX_CLASSES), "sizes": _list(_int(1, MAX_CLASSES), MAX_CLASSES)},
            ("order", "sizes"))}, ("source", "scenario"))),
        "provenance": _any_object,
        "test_sample": _object({"cap": _int(0, 1_000_000), "counts": _list(_int(0, 1 << 40), MAX_CLASSES),
                                "declined_tasks": _list(_int(1, MAX_CLASSES), MAX_CLASSES)}, closed=True),
    }


REQUIRED = ("arch", "width", "image_size", "normalization", "method", "method_config", "train_config", "memory", "seed")


def check_state_json(data: object, where: Path | str) -> None:
    """Check the JSON types and bounds of every field of a parsed ``learner.json``.

    Args:
        data: what ``json.loads`` gave.
        where: the file, named in the message.

    Raises:
        LearnerError: one sentence naming the field and what is wrong with it.
    """
    check_format_version(data, where)
    data = cast(dict, data)
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise _damaged(where, f"the field {missing[0]} is missing")
    for key, check in _state_fields().items():
        if key in data:
            problem = check(data[key])
            if problem:
                raise _damaged(where, _join(key, problem))
    problem = _method_config(data["method"])(data["method_config"])
    if problem:
        raise _damaged(where, f"method_config{problem}")
    problem = _cross_check(data)
    if problem:
        raise _damaged(where, problem)


def _cross_check(data: dict) -> str | None:
    """What the fields must agree on: one task per class, one history entry per task, known classes."""
    names, task_of = data.get("class_names", []), data.get("class_task", [])
    tasks, history = data.get("tasks", []), data.get("history", [])
    if len(set(names)) != len(names):
        return "class_names has a name twice"
    if len(task_of) != len(names):
        return f"class_task has {len(task_of)} entries for {len(names)} classes"
    if tasks and max(task_of) >= len(tasks):
        return f"class_task names task {max(task_of)} but the learner has {len(tasks)} tasks"
    if len(history) != len(tasks):
        return f"history has {len(history)} steps but tasks has {len(tasks)}"
    known = set(names)
    for i, task in enumerate(tasks):
        unknown = [c for c in task["classes"] if c not in known]
        if unknown:
            return f"tasks[{i}] names the class {unknown[0]!r}, which is not in class_names"
    return None


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
            header, start = _read_header(f, size, path)
            data = f.read(size - start)
    except FileNotFoundError:
        raise  # a reader that lost a race with a writer's commit reads learner.json again (sbcli.learner)
    except OSError as err:
        raise LearnerError(f"Could not read {path} ({err.strerror or err}); check its permissions.") from err
    if len(data) != size - start:
        raise _damaged(path, "it changed while it was being read")
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
        raise _damaged(path, f"it is {size} bytes long, too short for a safetensors file")
    (length,) = struct.unpack("<Q", head)
    if length > MAX_HEADER_BYTES or 8 + length > size:
        raise _damaged(path, f"its header claims {length} bytes but the file has {size} (truncated or not safetensors)")
    raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise _damaged(path, "its header is not valid JSON (truncated or not safetensors)") from err
    if not isinstance(header, dict):
        raise _damaged(path, "its header is not a JSON object")
    return header, 8 + length


def _entries(header: dict, data_len: int, path: Path) -> dict[str, tuple[torch.dtype, list[int], int, int]]:
    """Name -> (dtype, shape, begin, end), checked: known dtypes, sizes that match, an exact tiling of the data."""
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise _damaged(path, "its __metadata__ is not a map of strings")
            continue
        entries[name] = _entry(name, info, path)
    spans = sorted((begin, end, name) for name, (_, _, begin, end) in entries.items())
    position = 0
    for begin, end, name in spans:
        if begin != position:
            raise _damaged(path, f"the bytes of {name!r} start at {begin}, expected {position} (overlap or hole)")
        position = end
    if position != data_len:
        raise _damaged(path, f"its tensors cover {position} bytes of the {data_len} the file holds")
    return entries


def _entry(name: str, info: object, path: Path) -> tuple[torch.dtype, list[int], int, int]:
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise _damaged(path, f"the header entry of {name!r} is not dtype, shape and data_offsets")
    dtype = SAFETENSORS_DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if dtype is None:
        raise _damaged(path, f"{name!r} has the unknown dtype {_found(info['dtype'])}")
    shape, offsets = info["shape"], info["data_offsets"]
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_whole(d) for d in shape):
        raise _damaged(path, f"{name!r} has the malformed shape {_found(shape)}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_whole(o) for o in offsets) \
            or offsets[0] > offsets[1]:
        raise _damaged(path, f"{name!r} has the malformed data_offsets {_found(offsets)}")
    numel = math.prod(shape)
    if numel * dtype.itemsize != offsets[1] - offsets[0]:
        raise _damaged(path, f"{name!r} is {shape} of {info['dtype']} but spans {offsets[1] - offsets[0]} bytes")
    return dtype, shape, offsets[0], offsets[1]


def _whole(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62


# -- tensors against learner.json -------------------------------------------------------------


def check_model_tensors(tensors: dict[str, torch.Tensor], state: Any, where: Path | str) -> None:
    """The network's weights as the learner's architecture has them: names, shapes, dtypes, finite.

    Method state (``extra.*``) must be float32 or int64 and finite. The expected weights come
    from the network built on the ``meta`` device, so nothing is allocated here.

    Raises:
        LearnerError: a missing, unexpected, misshaped, non-float32 or non-finite tensor.
    """
    from sbcli.nets import create_model

    with torch.device("meta"):
        expected = create_model(state.arch, state.num_classes, state.width).state_dict()
    weights = {k: v for k, v in tensors.items() if not k.startswith(EXTRA_PREFIX)}
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or unexpected:
        what = f"the weight {missing[0]} is missing" if missing else f"it has the unknown weight {unexpected[0]}"
        raise _damaged(where, f"{what} for a {state.arch} of width {state.width} with {state.num_classes} classes")
    for name, want in expected.items():
        got = weights[name]
        if got.dtype != want.dtype:
            raise _damaged(where, f"{name} is stored as {_dtype(got.dtype)}, not {_dtype(want.dtype)}")
        if tuple(got.shape) != tuple(want.shape):
            raise _damaged(where, f"{name} has shape {list(got.shape)}, the network needs {list(want.shape)}")
    for name, value in tensors.items():
        if name.startswith(EXTRA_PREFIX) and value.dtype not in (torch.float32, torch.int64):
            raise _damaged(where, f"{name} is stored as {_dtype(value.dtype)}, not float32 or int64")
        _check_finite(name, value, where)


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_finite(name: str, value: torch.Tensor, where: Path | str) -> None:
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise _damaged(where, f"{name} holds NaN or infinite values")


def check_memory_tensors(tensors: dict[str, torch.Tensor], state: Any, where: Path | str) -> None:
    """Exemplars: uint8 images [M, 3, S, S] at the learner's image size, int64 labels [M] of known classes.

    Raises:
        LearnerError: missing or extra tensors, wrong dtypes or shapes, labels out of range, or
            more exemplars than the learner's budget.
    """
    if set(tensors) != {"images", "labels"}:
        names = ", ".join(sorted(tensors)) or "nothing"
        raise _damaged(where, f"it must hold images and labels, it holds {names}")
    images, labels = tensors["images"], tensors["labels"]
    if images.dtype != torch.uint8:
        raise _damaged(where, f"the exemplar images are {_dtype(images.dtype)}, not uint8")
    if labels.dtype != torch.int64:
        raise _damaged(where, f"the exemplar labels are {_dtype(labels.dtype)}, not int64")
    count, size = labels.shape[0] if labels.dim() == 1 else -1, state.image_size
    if labels.dim() != 1 or images.dim() != 4 or images.shape[0] != count or images.shape[1] != 3:
        raise _damaged(where, f"images {list(images.shape)} and labels {list(labels.shape)} are not [M, 3, H, W] and [M]")
    if count and tuple(images.shape[2:]) != (size, size):
        raise _damaged(where, f"the exemplar images are {images.shape[2]}x{images.shape[3]}, the learner's are {size}x{size}")
    budget = state.memory.get("budget", 0)
    if count > budget:
        raise _damaged(where, f"it holds {count} exemplars, more than the learner's budget of {budget}")
    if count and (int(labels.min()) < 0 or int(labels.max()) >= state.num_classes):
        raise _damaged(where, f"an exemplar label lies outside 0..{state.num_classes - 1}")
