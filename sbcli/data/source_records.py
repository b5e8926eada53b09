"""A task's data source as the learner records it: as the user named it, plus fingerprints.

A *spec* (``sbcli.data.catalog.resolve_spec``) says where the data is on this machine and is
used only while a command runs. A *record* is what ``learner.json`` keeps::

    {"kind": "folder", "name": "train", "dataset": "photos", "image_size": 32,
     "train": {"classes": [...], "counts": [...], "sha256": "..."},
     "test": {"name": "val", "classes": [...], "counts": [...], "sha256": "..."}}

``name`` is the folder's own name (or the benchmark's: ``cifar100``, ``demo``), never a path,
so a learner shows nothing of the layout or the user name of the machine that trained it; it finds
the test folder under ``--data-root``. ``dataset``, when it differs, is what a person calls the data:
the ``--name`` given, or the folder above a split folder (``photos`` for ``photos/train``).
``sbcli.data.whereabouts`` remembers, on this machine only, where a fingerprint was last seen.

Learners of format 1 recorded specs with absolute paths; :func:`public_record` turns those into
records (names only, no fingerprints) and :func:`is_legacy` tells them apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sbcli.data import whereabouts
from sbcli.data.fingerprint import Fingerprint, fingerprint
from sbcli.data.imageset import ImageSet
from sbcli.errors import ConfigError

PATH_KEYS = ("path", "root", "test")
# Folder names that say which split a folder is, not what the data is: photos/train is "photos".
SPLIT_NAMES = frozenset({"train", "training", "test", "testing", "val", "valid", "validation"})


SOURCE_KEYS = ("kind", "name", "dataset", "image_size", "train", "test")


@dataclass(frozen=True)
class SourceRecord:
    """A task's recorded data source (a record, or a format-1 spec), typed for its readers.

    ``train`` and ``test`` are the recorded fingerprints (``test`` of a format-1 spec: its path, a string);
    ``extra`` keeps every other key (a format-1 spec's ``path`` and ``root``, keys of a newer sbcli) and
    ``order`` the order the keys were written in, so that ``to_json`` gives back the object it was read from.
    """

    kind: str
    name: str | None = None
    dataset: str | None = None
    image_size: int | None = None
    train: dict[str, Any] | None = None
    test: dict[str, Any] | str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def train_counts(self) -> list[int] | None:
        """The training images of each class, as recorded (None: not recorded, e.g. format 1)."""
        return None if self.train is None else self.train.get("counts")

    @property
    def legacy_path(self) -> str | None:
        """Where a format-1 spec said the test images were on the machine that trained it (None for a record)."""
        if not is_legacy(self.to_json()):
            return None
        if self.kind == "folder":
            return self.test if isinstance(self.test, str) else None
        return self.extra.get("path", self.extra.get("root"))

    def to_json(self) -> dict[str, Any]:
        known = {k: getattr(self, k) for k in SOURCE_KEYS if getattr(self, k) is not None}
        data = {**known, **self.extra}
        first = [k for k in self.order if k in data]
        return {k: data[k] for k in [*first, *(k for k in data if k not in first)]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SourceRecord:
        return cls(**{k: data[k] for k in SOURCE_KEYS if k in data},
                   extra={k: v for k, v in data.items() if k not in SOURCE_KEYS}, order=tuple(data))


def source_name(spec: dict) -> str:
    """The name a record shows for a spec: the folder's or zip's own name, or the benchmark's."""
    if spec["kind"] in ("folder", "tiny-imagenet") and "path" in spec:
        return Path(spec["path"]).name
    return spec["kind"]


def dataset_name(spec: dict, given: str | None = None) -> str:
    """What a person calls the data: ``given`` (``--name``), else the folder above a split folder
    (``photos`` for ``photos/train``), else :func:`source_name`."""
    if given:
        return given
    name = source_name(spec)
    path = Path(spec["path"]) if "path" in spec else None
    if path is not None and name.lower() in SPLIT_NAMES and _plain_name(path.parent.name):
        return path.parent.name
    return name


def check_dataset_name(name: str | None) -> None:
    """``--name`` is a name, not a path."""
    if name is not None and not (_plain_name(name) and len(name) <= 200):
        raise ConfigError(f"--name {name!r} is not a name; give a short name without '/' (e.g. --name holiday-photos).")


def display_name(record: dict) -> str:
    """The name a card or a table shows for a recorded source (format 1 included)."""
    public = public_record(record)
    return public.get("dataset") or public["name"]


def source_record(spec: dict, train: ImageSet | Fingerprint | None, test: ImageSet | None,
                  dataset: str | None = None) -> dict:
    """The record of an opened spec: names and fingerprints, no path; ``dataset``: the name the user gave.
    ``train`` may be the fingerprint itself, of a set that was streamed (:mod:`sbcli.data.stream`)."""
    record: dict = {"kind": spec["kind"], "name": source_name(spec)}
    shown = dataset_name(spec, dataset)
    if shown != record["name"]:
        record["dataset"] = shown
    if "image_size" in spec:
        record["image_size"] = spec["image_size"]
    if train is not None:
        record["train"] = (train if isinstance(train, Fingerprint) else fingerprint(train)).to_json()
    if test is not None:
        test_name = Path(spec["test"]).name if spec.get("test") else record["name"]
        record["test"] = {"name": test_name, **fingerprint(test).to_json()}
    return record


def is_legacy(record: dict) -> bool:
    """A format-1 spec (absolute paths, no fingerprints) rather than a record."""
    return any(key in record and isinstance(record[key], str) for key in PATH_KEYS)


def is_record(value: object) -> bool:
    """A record of this format (a ``name``, no path), as opposed to a format-1 spec."""
    return isinstance(value, dict) and "name" in value and not is_legacy(value)


def public_record(record: dict) -> dict:
    """``record`` with every path replaced by its last part (a format-1 spec becomes a record).

    Format 1 also recorded benchmarks by kind alone (``{"kind": "demo"}``): they get the kind as name.
    """
    if not is_legacy(record):
        return record if "name" in record else {"name": source_name(record), **record}
    out = {"kind": record["kind"], "name": source_name(record)}
    if dataset_name(record) != out["name"]:
        out["dataset"] = dataset_name(record)
    if "image_size" in record:
        out["image_size"] = record["image_size"]
    if record.get("test") and isinstance(record["test"], str):
        out["test"] = {"name": Path(record["test"]).name}
    return out


def test_fingerprint(record: dict) -> Fingerprint | None:
    """The recorded fingerprint of the test split, if the record has one."""
    test = record.get("test")
    if isinstance(test, dict) and "sha256" in test:
        return Fingerprint.from_json(test)
    return None


def test_name(record: dict) -> str | None:
    """The recorded name of the test folder (or the benchmark), None when no test split was given."""
    test = record.get("test")
    if isinstance(test, dict):
        return test.get("name")
    if isinstance(test, str):
        return Path(test).name
    return record["kind"] if record["kind"] != "folder" else None


def same_source(stored: dict, current: dict) -> bool:
    """Whether a stored record names the same source as a fresh one (by name alone for format 1).

    The shown name (``dataset``) is not the source: records from before it was kept have none.
    """
    if is_legacy(stored):
        keys = ("kind", "name", "image_size")
        return all(public_record(stored).get(k) == current.get(k) for k in keys)
    unnamed = lambda r: {k: v for k, v in r.items() if k != "dataset"}  # noqa: E731
    return unnamed(stored) == unnamed(current)


def remember_source(spec: dict, train: ImageSet | Fingerprint | None, test: ImageSet | None,
                    dataset: str | None = None) -> dict:
    """:func:`source_record`, and this machine remembers where the test set is
    (:mod:`sbcli.data.whereabouts`), so that ``sb evaluate`` finds it from any working directory."""
    record = source_record(spec, train, test, dataset)
    where = spec.get("test") or spec.get("path") or spec.get("root")
    if test is not None and where:
        whereabouts.remember(record["test"]["sha256"], Path(where))
    return record


def _plain_name(name: object) -> bool:
    """A folder's own name: no separator, not '.' or '..', not empty."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _fingerprint_problem(v: object, max_classes: int) -> str | None:
    if not isinstance(v, dict):
        return "must be an object with classes, counts and sha256"
    classes, counts, sha = v.get("classes"), v.get("counts"), v.get("sha256")
    if not isinstance(classes, list) or not all(isinstance(c, str) and len(c) <= 1000 for c in classes):
        return ".classes must be a list of class names"
    if len(classes) > max_classes:
        return f".classes has {len(classes)} names, more than {max_classes}"
    if not isinstance(counts, list) or len(counts) != len(classes) or not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 2**40 for c in counts):
        return ".counts must hold one image count per class"
    if not isinstance(sha, str) or len(sha) != 64 or any(ch not in "0123456789abcdef" for ch in sha):
        return ".sha256 must be 64 lower-case hex digits"
    return None


def record_problem(v: object, max_classes: int = 100_000) -> str | None:
    """What is wrong with the JSON of a record (not a format-1 spec), or None; for load-time checks."""
    if not isinstance(v, dict):
        return " must be an object"
    allowed = {"kind", "name", "dataset", "image_size", "train", "test"}
    unknown = sorted(set(v) - allowed)
    if unknown:
        return f".{unknown[0]} is not a known field of a data source record"
    if not isinstance(v.get("kind"), str) or not _plain_name(v.get("name")):
        return " must have a kind and a name (a folder or benchmark name, not a path)"
    if "dataset" in v and not (_plain_name(v["dataset"]) and len(v["dataset"]) <= 200):
        return ".dataset must be a name (not a path)"
    size = v.get("image_size", 32)
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 4096:
        return ".image_size must be a whole number of pixels"
    if "train" in v and (problem := _fingerprint_problem(v["train"], max_classes)):
        return ".train" + problem
    test = v.get("test")
    if test is not None:
        if not isinstance(test, dict) or not _plain_name(test.get("name")):
            return ".test must be an object with the test set's name"
        if "sha256" in test and (problem := _fingerprint_problem(test, max_classes)):
            return ".test" + problem
    return None
