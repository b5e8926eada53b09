"""``learner.json`` checked at load, and the settings a run is about to record checked by the same rules.

:func:`read_json` and :func:`check_state_json`: ``learner.json`` is UTF-8 JSON, an object, with a
whole-number ``format_version`` and the JSON type and bounds of every field (``width <= MAX_WIDTH``,
``image_size <= MAX_IMAGE_SIZE``, ``MAX_CLASSES`` classes ...), so that a crafted file cannot make
sbcli allocate gigabytes; then what the fields must agree on (one task per class, one history entry
per task). :func:`check_settings` refuses an option value that a later load would call damage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from sbcli.errors import ConfigError, LearnerError
from sbcli.learner.validate.fields import (
    Check,
    any_object,
    boolean,
    config_of,
    damaged,
    found,
    join,
    list_of,
    number,
    object_of,
    optional,
    string,
    whole,
)
from sbcli.source_kinds import SOURCE_KINDS

MAX_WIDTH = 4.0  # ResNet-18 at width 4: 180 M parameters (the paper uses 1.0)
MAX_IMAGE_SIZE = 512
MAX_CLASSES = 100_000
MAX_BUDGET = 10_000_000
MAX_EPOCHS = 1_000_000
MAX_BATCH = 1 << 20
MAX_SEED = 1 << 40  # seed * 1000 + step must stay a valid torch seed


# -- learner.json -----------------------------------------------------------------------------


def read_json(path: Path) -> object:
    """The JSON value in ``path``. Raises LearnerError (one sentence) when unreadable or not UTF-8 JSON."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
        return json.loads(text)
    except OSError as err:
        raise LearnerError(f"Could not read {path} ({err.strerror or err}); check its permissions.") from err
    except UnicodeDecodeError as err:
        raise damaged(path, f"it is not UTF-8 text (byte {err.start})") from err
    except (ValueError, RecursionError) as err:  # JSONDecodeError, too many digits, nesting too deep
        raise damaged(path, f"it is not valid JSON ({str(err).splitlines()[0][:120]})") from err


def check_format_version(data: object, where: Path | str) -> int:
    """The learner's ``format_version`` (a whole number >= 1), after checking ``data`` is an object."""
    if not isinstance(data, dict):
        raise damaged(where, f"it holds {found(data)}, not a JSON object")
    version = data.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version < 1 << 31:
        raise damaged(where, f"format_version must be a whole number such as 1, found {found(version)}")
    return version


def _source(v: Any) -> str | None:
    """A data source record (names and fingerprints: sbcli.data.source_records), or a format-1 spec with paths."""
    from sbcli.data.source_records import is_record, record_problem

    if is_record(v):
        if "kind" not in v:
            return ".kind is missing"
        problem = string(SOURCE_KINDS)(v["kind"])
        return join(".kind", problem) if problem else _strip(record_problem(v, MAX_CLASSES))
    fields = {"kind": string(SOURCE_KINDS), "path": string(), "root": string(), "test": string(), "download": boolean,
              "image_size": whole(1, MAX_IMAGE_SIZE)}
    problem = object_of(fields, ("kind",))(v)
    if problem:
        return problem
    needs = {"folder": ("path", "image_size"), "tiny-imagenet": ("path",), "cifar10": ("root",), "cifar100": ("root",)}
    missing = [k for k in needs.get(v["kind"], ()) if k not in v]
    return f".{missing[0]} is missing" if missing else None


def _strip(problem: str | None) -> str | None:
    return None if problem is None else problem.lstrip()


def _train_config() -> Check:
    from sbcli.engine.loop import PRECISIONS, TrainConfig

    known = {"epochs": whole(1, MAX_EPOCHS), "batch_size": whole(1, MAX_BATCH), "eval_batch_size": whole(1, MAX_BATCH),
             "lr": number(0, 1e6), "momentum": number(0, 1), "weight_decay": number(0, 1e6),
             "milestones": list_of(number(0, 1), 1000), "lr_decay": number(0, 1e6), "compile": boolean,
             "cuda_graphs": boolean, "balance_before_wa": boolean,
             "precision": string(tuple(PRECISIONS)), "threads": optional(whole(1, 1024))}
    return config_of(TrainConfig, known)


def _method_config(method: str) -> Check:
    from sbcli.methods import METHODS

    return config_of(METHODS.get(method).config, {})


def _arch(v: Any) -> str | None:
    """sbcli's architectures, or ``timm/NAME`` (a timm backbone: checked when the network is built)."""
    from sbcli.nets import list_models
    from sbcli.nets.timm_backbone import PREFIX

    if isinstance(v, str) and v.startswith(PREFIX) and 0 < len(v) - len(PREFIX) <= 200:
        return None
    return string(list_models)(v)


def _state_fields() -> dict[str, Check]:
    from sbcli.methods import METHODS
    from sbcli.methods.memory import SELECTIONS

    three = list_of(number(-1e6, 1e6), 3, 3)
    percent = optional(number(0, 100, nan=True))  # null: no value (strict JSON); NaN: an older learner's
    metrics = object_of({"overall": percent, "per_task": list_of(percent, MAX_CLASSES),
                       **{k: optional(percent) for k in ("old", "new", "intra_old", "intra_new")}},
                      ("overall", "per_task"))
    return {
        "arch": _arch, "width": number(0, MAX_WIDTH, lo_open=True),
        "image_size": whole(1, MAX_IMAGE_SIZE),
        "normalization": object_of({"mean": three, "std": list_of(number(0, 1e6, lo_open=True), 3, 3)}, ("mean", "std")),
        "method": string(METHODS.names), "method_config": any_object, "train_config": _train_config(),
        "memory": object_of({"budget": whole(0, MAX_BUDGET), "selection": string(SELECTIONS), "seed": whole(-MAX_SEED, MAX_SEED)},
                          ("budget",), closed=True),
        "seed": whole(-MAX_SEED, MAX_SEED),
        "class_names": list_of(string(max_len=1000), MAX_CLASSES),  # none yet: a backbone waiting for its first task
        "class_task": list_of(whole(0, MAX_CLASSES), MAX_CLASSES),
        "tasks": list_of(object_of({"classes": list_of(string(max_len=1000), MAX_CLASSES, 0), "source": _source},
                               ("classes", "source")), MAX_CLASSES),
        "history": list_of(object_of({"step": whole(1, MAX_CLASSES), "num_classes": whole(0, MAX_CLASSES), "metrics": metrics,
                                      "network_metrics": metrics, "known_images": whole(1, 1 << 40),
                                      "forgotten": list_of(string(max_len=1000), MAX_CLASSES, 1)}, ("step", "num_classes", "metrics")), MAX_CLASSES),
        "plan": optional(object_of({"source": _source, "scenario": object_of({
            "order": list_of(whole(0, MAX_CLASSES), MAX_CLASSES), "sizes": list_of(whole(1, MAX_CLASSES), MAX_CLASSES)},
            ("order", "sizes"))}, ("source", "scenario"))),
        "provenance": any_object,
        "test_sample": object_of({"cap": whole(0, 1_000_000), "counts": list_of(whole(0, 1 << 40), MAX_CLASSES),
                                "declined_tasks": list_of(whole(1, MAX_CLASSES), MAX_CLASSES)}, closed=True),
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
        raise damaged(where, f"the field {missing[0]} is missing")
    for key, check in _state_fields().items():
        if key in data:
            problem = check(data[key])
            if problem:
                raise damaged(where, join(key, problem))
    problem = _method_config(data["method"])(data["method_config"])
    if problem:
        raise damaged(where, f"method_config{problem}")
    problem = _cross_check(data)
    if problem:
        raise damaged(where, problem)


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
    for i, task in enumerate(tasks):
        # a class a later step took out (sb forget) is named by the task that taught it, not in class_names
        known = set(names).union(*(h.get("forgotten") or () for h in history[i + 1:]))
        unknown = [c for c in task["classes"] if c not in known]
        if unknown:
            return f"tasks[{i}] names the class {unknown[0]!r}, which is not in class_names"
        if not task["classes"] and not (i < len(history) and (history[i].get("known_images") or history[i].get("forgotten"))):
            return f"tasks[{i}] brought no class, no images of known classes and took none out"
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
    data = json.loads(json.dumps(settings, allow_nan=True))  # tuples as lists, exactly as saved
    checks = {**_state_fields(), **({"method_config": _method_config(data["method"])} if "method" in data else {})}
    for key, value in data.items():
        problem = checks[key](value) if key in checks else None
        if problem:
            field, _, rest = join(key, problem).partition(" ")
            name = field.split(".", 1)[1] if key in ("train_config", "method_config") else field
            option = _OPTION_OF.get(field, "--" + name.replace("_", "-"))
            raise ConfigError(f"{option} {rest}; a learner saved with it could not be loaded again.")
