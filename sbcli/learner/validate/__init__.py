"""Every learner file is checked at load, before any work: one sentence for anything malformed.

A learner may come from anywhere (a pull, a copy, a crafted file), so nothing in it is trusted:

* :func:`read_json` and :func:`check_state_json`: ``learner.json`` is UTF-8 JSON, an object, with
  a whole-number ``format_version`` and the JSON type and bounds of every field
  (``width <= MAX_WIDTH``, ``image_size <= MAX_IMAGE_SIZE``, ``MAX_CLASSES`` classes ...), so that a
  crafted file cannot make sbcli allocate gigabytes.
* (in :mod:`sbcli.learner.validate.tensors`, re-exported here) :func:`read_safetensors`: a safetensors file read without trusting it: the header length is
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
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from sbcli.errors import LearnerError
from sbcli.learner.validate.tensors import (  # noqa: F401  (the tensor checks live there; re-exported here)
    EXTRA_PREFIX,
    MAX_DIMS,
    MAX_HEADER_BYTES,
    RESTORE,
    SAFETENSORS_DTYPES,
    _damaged,
    _found,
    check_memory_tensors,
    check_model_tensors,
    parse_safetensors,
    read_safetensors,
)

MAX_WIDTH = 4.0  # ResNet-18 at width 4: 180 M parameters (the paper uses 1.0)
MAX_IMAGE_SIZE = 512
MAX_CLASSES = 100_000
MAX_BUDGET = 10_000_000
MAX_EPOCHS = 1_000_000
MAX_BATCH = 1 << 20
MAX_SEED = 1 << 40  # seed * 1000 + step must stay a valid torch seed


Check = Callable[[Any], str | None]  # a value -> None when it is fine, else what is wrong with it



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
        if lo <= -1e300 and hi >= 1e300:
            return f"must be a finite number, found {_found(v)}"
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
        if "kind" not in v:
            return ".kind is missing"
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
    from sbcli.engine.loop import PRECISIONS, TrainConfig

    known = {"epochs": _int(1, MAX_EPOCHS), "batch_size": _int(1, MAX_BATCH), "eval_batch_size": _int(1, MAX_BATCH),
             "lr": _number(0, 1e6), "momentum": _number(0, 1), "weight_decay": _number(0, 1e6),
             "milestones": _list(_number(0, 1), 1000), "lr_decay": _number(0, 1e6), "compile": _bool,
             "cuda_graphs": _bool, "balance_before_wa": _bool,
             "precision": _str(tuple(PRECISIONS)), "threads": _optional(_int(1, 1024))}
    return _config(TrainConfig, known)


def _method_config(method: str) -> Check:
    from sbcli.methods import METHODS

    return _config(METHODS.get(method).config, {})


def _arch(v: Any) -> str | None:
    """sbcli's architectures, or ``timm/NAME`` (a timm backbone: checked when the network is built)."""
    from sbcli.nets import list_models
    from sbcli.nets.timm_backbone import PREFIX

    if isinstance(v, str) and v.startswith(PREFIX) and 0 < len(v) - len(PREFIX) <= 200:
        return None
    return _str(list_models)(v)


def _state_fields() -> dict[str, Check]:
    from sbcli.methods import METHODS
    from sbcli.methods.memory import SELECTIONS

    three = _list(_number(-1e6, 1e6), 3, 3)
    percent = _number(0, 100, nan=True)
    metrics = _object({"overall": percent, "per_task": _list(percent, MAX_CLASSES),
                       **{k: _optional(percent) for k in ("old", "new", "intra_old", "intra_new")}},
                      ("overall", "per_task"))
    return {
        "arch": _arch, "width": _number(0, MAX_WIDTH, lo_open=True),
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


# -- settings about to be recorded ---------------------------------------------------------------

# Where a recorded field's value comes from on the command line, when not --FIELD-NAME.
_OPTION_OF = {"memory.budget": "--memory", "memory.seed": "--seed", "memory.selection": "--selection"}


def check_settings(settings: dict[str, Any]) -> None:
    """Refuse settings a run is about to record by the very rules a load applies to ``learner.json``.

    A value the loader would call damage (``--lr nan``, ``--momentum 2``, ``--batch-size 10**12``,
    ``--seed 2**70``) is refused before any work, rather than written into a learner that every
    later command then refuses.

    Args:
        settings: fields of ``learner.json`` as a run records them (``train_config``, ``method``,
            ``method_config``, ``memory``, ``seed``, ``arch``, ``width``, ``image_size``; any subset),
            dataclasses as their ``asdict``.

    Raises:
        ConfigError: one sentence naming the option and the allowed range.
    """
    from sbcli.errors import ConfigError

    data = json.loads(json.dumps(settings, allow_nan=True))  # tuples as lists, exactly as saved
    checks = {**_state_fields(), **({"method_config": _method_config(data["method"])} if "method" in data else {})}
    for key, value in data.items():
        problem = checks[key](value) if key in checks else None
        if problem:
            field, _, rest = _join(key, problem).partition(" ")
            name = field.split(".", 1)[1] if key in ("train_config", "method_config") else field
            option = _OPTION_OF.get(field, "--" + name.replace("_", "-"))
            raise ConfigError(f"{option} {rest}; a learner saved with it could not be loaded again.")
