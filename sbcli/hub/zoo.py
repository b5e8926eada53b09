"""The zoo: pretrained task sequences by name (``zoo/index.toml``) and the recipes that made them.

Each ``[entries.NAME]`` table says what the learner is (dataset, class order, classes per task,
method, inference rule, network), where it lives, the SHA-256 of every file to verify after
download, the recipe (``zoo/recipes/NAME.toml``) that trained it and the metrics that run
measured. Where it lives is one of:

* ``bundled:learners/NAME``: shipped inside sbcli (``zoo/learners/``), so ``sb pull`` works offline;
* ``hub:OWNER/NAME`` with a ``revision``: a Hugging Face Hub repository;
* ``package:NAME``: a backbone whose weights install from the package index (``--pretrained NAME``,
  :mod:`sbcli.hub.weight_packages`), pinned to the SHA-256 of the package's weights file;
* ``unpublished``: not published anywhere; ``build`` is the command that makes it from its recipe.

What it holds (``holds``) is a learner (the default) or a ``backbone``: pretrained weights on the Hub
(``model.safetensors`` of a repository such as ``timm/resnet50.a1_in1k``), pinned to a revision and a
SHA-256, which ``sb pull`` makes into a learner with no classes yet (:mod:`sbcli.run.backbone_learner`): its
recipe names the method and settings, ``sb add-task`` learns the user's first classes.

An entry never claims a location it does not have: the tests check every bundled entry's files
and hashes, and an unpublished entry has no files.

The index is found inside the installed package (``sbcli/_zoo``, force-included by the wheel) or
in the source tree (``zoo/``), the same way :mod:`sbcli.config.recipes` finds recipes.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from sbcli.errors import ConfigError, UnknownNameError
from sbcli.hub.client import is_repo_id, is_safe_name, revision_problem

ZOO_DIRS = (Path(__file__).resolve().parents[1] / "_zoo", Path(__file__).resolve().parents[2] / "zoo")
INDEX_FILE = "index.toml"
INDEX_FORMAT = 1
NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
KINDS = ("bundled", "hub", "package", "build", "unpublished")
DATA_KEYS = {"file", "sha256", "per_class", "test_per_class"}  # a built entry's ``data`` table
HOLDS = ("learner", "backbone")
BACKBONE_FILE = "model.safetensors"  # what a backbone entry's repository holds (sbcli.hub.pretrained.SAFETENSORS)


@dataclass(frozen=True)
class ZooEntry:
    """One pretrained task sequence of the index (see the module docstring for the fields)."""

    name: str
    description: str
    dataset: str
    class_order: list[str] | str  # the class names in learning order, or how the order is drawn
    tasks: list[int]  # classes learned at each step
    method: str
    inference: str
    network: str
    image_size: int
    recipe: str
    location: str
    build: str
    revision: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256 hex
    metrics: dict[str, Any] = field(default_factory=dict)
    holds: str = "learner"  # or "backbone": weights that `sb pull` makes into a learner with no classes yet
    licence: str = ""  # the terms of the data it learned from
    data: dict[str, Any] = field(default_factory=dict)  # a built entry's subset: file, sha256, per_class, test_per_class

    @property
    def kind(self) -> str:
        return self.location.split(":", 1)[0]

    @property
    def target(self) -> str:
        """What follows ``bundled:`` or ``hub:``; empty for unpublished entries."""
        return self.location.split(":", 1)[1] if ":" in self.location else ""

    @property
    def num_classes(self) -> int:
        return sum(self.tasks)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "dataset": self.dataset, "kind": self.kind,
                "location": self.location, "revision": self.revision, "classes": self.num_classes,
                "tasks": self.tasks, "method": self.method, "inference": self.inference, "network": self.network,
                "image_size": self.image_size, "recipe": self.recipe, "build": self.build,
                "class_order": self.class_order, "files": self.files, "metrics": self.metrics, "holds": self.holds,
                "licence": self.licence, "data": self.data}


@dataclass(frozen=True)
class ZooIndex:
    """The parsed index and the folder it came from (bundled locations are relative to it)."""

    folder: Path
    entries: dict[str, ZooEntry]

    def get(self, name: str) -> ZooEntry:
        """The entry ``name``; raises UnknownNameError (with a suggestion) when there is none."""
        if name not in self.entries:
            raise UnknownNameError("zoo entry", name, list(self.entries))
        return self.entries[name]

    def bundled_dir(self, entry: ZooEntry) -> Path:
        """The folder of a bundled entry, which must lie inside the zoo folder."""
        rel = PurePosixPath(entry.target)
        if rel.is_absolute() or ".." in rel.parts:
            raise ConfigError(f"Zoo entry {entry.name} points outside the zoo ({entry.location}); fix the index.")
        return self.folder / rel

    def recipe_path(self, entry: ZooEntry) -> Path:
        return self.folder / "recipes" / f"{entry.recipe}.toml"


def default_index_path() -> Path:
    """``index.toml`` of the installed package, else of the source tree."""
    for folder in ZOO_DIRS:
        if (folder / INDEX_FILE).is_file():
            return folder / INDEX_FILE
    raise ConfigError("The zoo index is missing from this sbcli installation; reinstall sbcli.")


def load_index(path: Path | None = None) -> ZooIndex:
    """Read and check a zoo index (the bundled one by default).

    Raises:
        ConfigError: the file is missing, not TOML, of a newer format, or has an invalid entry.
    """
    path = Path(path) if path is not None else default_index_path()
    if not path.is_file():
        raise ConfigError(f"Zoo index {path} does not exist; check the path given to --index.")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"Zoo index {path} is not valid TOML ({err}); fix the file.") from err
    if data.get("format", INDEX_FORMAT) > INDEX_FORMAT:
        raise ConfigError(f"Zoo index {path} has format {data['format']}, newer than this sbcli reads; upgrade sbcli.")
    entries = {name: parse_entry(name, table, path) for name, table in data.get("entries", {}).items()}
    return ZooIndex(path.parent, entries)


def parse_entry(name: str, table: dict[str, Any], path: Path) -> ZooEntry:
    """One ``[entries.NAME]`` table as a checked :class:`ZooEntry`."""
    if not NAME.fullmatch(name):
        raise ConfigError(f"Zoo entry name '{name}' in {path} must be lower-case letters, digits, '.', '_' or '-'.")
    try:
        entry = ZooEntry(name=name, **table)
    except TypeError as err:
        raise ConfigError(f"Zoo entry {name} in {path} has missing or unknown fields ({err}); fix the index.") from err
    problem = _entry_problem(entry)
    if problem:
        raise ConfigError(f"Zoo entry {name} in {path} {problem}; fix the index.")
    return entry


def _entry_problem(entry: ZooEntry) -> str:
    """Why an entry is inconsistent, or "" when it is fine."""
    if entry.kind not in KINDS:
        return f"has location '{entry.location}'; use bundled:PATH, hub:OWNER/NAME, package:NAME, build:PACKAGE or unpublished"
    if entry.holds not in HOLDS:
        return f"holds '{entry.holds}'; use {' or '.join(HOLDS)}"
    if entry.holds == "backbone" and entry.kind == "package":
        return _package_problem(entry)
    if entry.kind == "package":
        return "lives in a weight package, which holds a backbone only; add holds = \"backbone\""
    if entry.kind == "build" and _build_problem(entry):
        return _build_problem(entry)
    if entry.holds == "backbone" and (entry.kind != "hub" or set(entry.files) != {BACKBONE_FILE} or entry.tasks):
        return (f"holds a backbone, which must be on the Hub at a revision with the SHA-256 of its {BACKBONE_FILE} "
                "alone (or in a weight package: package:NAME), and no tasks")
    if entry.kind == "unpublished" and (entry.files or entry.revision or entry.target):
        return "is unpublished but lists files, a revision or a target"
    if entry.kind == "hub" and not entry.revision:
        return "is on the Hub but names no revision"
    if entry.kind == "hub" and not is_repo_id(entry.target):
        return f"has location {ascii(entry.location)}, whose repository is not OWNER/NAME"
    if entry.kind == "hub" and revision_problem(entry.revision) is not None:
        return f"names the revision {ascii(entry.revision)}: {revision_problem(entry.revision)}"
    if not all(isinstance(n, str) and is_safe_name(n) for n in entry.files):
        return "lists a file name that would leave the learner's folder (absolute, '..', a backslash or a control character)"
    if entry.kind == "bundled" and not entry.files:
        return "is bundled but lists no file hashes"
    if entry.kind != "unpublished" and not isinstance(entry.class_order, list):
        return "is published but does not list its class names in class_order"
    if isinstance(entry.class_order, list) and len(entry.class_order) != entry.num_classes:
        return f"lists {len(entry.class_order)} classes in class_order but its tasks add up to {entry.num_classes}"
    if any(not re.fullmatch(r"[0-9a-f]{64}", h) for h in entry.files.values()):
        return "has a file hash that is not a SHA-256 hex digest"
    return ""


def _package_problem(entry: ZooEntry) -> str:
    """Why a backbone entry in a weight package is inconsistent, or "" when it is fine."""
    from sbcli.hub.weight_packages import PACKAGES

    pkg = PACKAGES.get(entry.target)
    if pkg is None:
        return f"names weight package '{entry.target}'; use one of {', '.join(PACKAGES)}"
    if entry.files != {Path(pkg.file).name: pkg.sha256} or entry.tasks or entry.revision:
        return (f"holds {pkg.name}'s backbone, which must list its weights file {Path(pkg.file).name} with the "
                "SHA-256 sbcli pins, no revision and no tasks")
    return ""


def _build_problem(entry: ZooEntry) -> str:
    """Why an entry built from a weight package and data is inconsistent, or "" when it is fine."""
    from sbcli.hub.weight_packages import PACKAGES

    data = entry.data
    if entry.holds != "learner" or entry.target not in PACKAGES or entry.revision:
        return f"is built on a weight package: use build:{' or build:'.join(PACKAGES)}, no revision, holds a learner"
    if set(data) != DATA_KEYS or not all(isinstance(data[k], int) and data[k] > 0 for k in ("per_class", "test_per_class")):
        return f"is built from data but its data table is not {{{', '.join(sorted(DATA_KEYS))}}} with counts above 0"
    if not isinstance(data["sha256"], str) or not re.fullmatch(r"[0-9a-f]{64}", data["sha256"]):
        return "has a data sha256 that is not a SHA-256 hex digest"
    if not entry.licence:
        return "is built from data but states no licence for it"
    if not isinstance(entry.class_order, list) or not all(isinstance(c, str) and is_safe_name(c) and "/" not in c
                                                          for c in entry.class_order):
        return "is built from data but does not list its class names (plain folder names) in class_order"
    if not entry.files or not entry.tasks:
        return "is built from data but lists no tasks or no file hashes of its build"
    return ""


def sha256_file(path: Path) -> str:
    """The SHA-256 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def mismatched_files(folder: Path, expected: dict[str, str]) -> list[str]:
    """The files of ``expected`` that are missing from ``folder`` or differ from their SHA-256."""
    return [name for name, digest in sorted(expected.items())
            if not (folder / name).is_file() or sha256_file(folder / name) != digest]


def hash_error(bad: list[str], origin: str) -> str:
    return (f"{', '.join(bad)} from {origin} does not match the zoo index (missing, corrupted or tampered with); "
            "nothing was installed.")
