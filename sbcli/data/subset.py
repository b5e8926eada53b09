"""A pinned subset of a data file: the first N training and test images of named classes, in file-name order.

A zoo entry that is built on the user's machine (``sb pull NAME --data FILE``) names its classes, how many
images of each it learned from, and the SHA-256 of exactly those images (:func:`subset_digest`). Any copy of
its data that holds the same image files gives the same subset, wherever the copy's folders start:

* class-per-folder: ``[TOP/]train/<class>/*`` and ``[TOP/]test/<class>/*`` (``val/`` for ``test/``);
* the official Tiny-ImageNet layout: ``[TOP/]train/<wnid>/images/*`` and ``[TOP/]val/images/*`` with
  ``[TOP/]val/val_annotations.txt`` naming each validation image's class.

The source is a ``.zip`` file or a directory. Nothing but the chosen images is read.
"""

from __future__ import annotations

import hashlib
import zipfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sbcli.errors import DataError

SPLITS = ("train", "test")
ANNOTATIONS = "val/val_annotations.txt"


@dataclass(frozen=True)
class SubsetSpec:
    """Which images: these classes, the first ``per_class`` training and ``test_per_class`` test images of each."""

    classes: list[str]
    per_class: int
    test_per_class: int


@dataclass(frozen=True)
class Subset:
    """The chosen images written as class-per-folder trees, and the SHA-256 that names them."""

    train: Path
    test: Path
    sha256: str
    images: int


class _Reader:
    """The member names of a zip file or a directory (POSIX paths) and a way to read one."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self._zip: zipfile.ZipFile | None = None
        if source.is_file():
            try:
                self._zip = zipfile.ZipFile(source)
            except (zipfile.BadZipFile, OSError) as err:
                raise DataError(f"{source} is not a readable zip file ({err}); give the data's zip file or its folder.") from err
            self.names = [n for n in self._zip.namelist() if not n.endswith("/")]
        elif source.is_dir():
            self.names = [p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file()]
        else:
            raise DataError(f"{source} does not exist; give the data's zip file or its folder.")

    def read(self, name: str) -> bytes:
        return self._zip.read(name) if self._zip is not None else (self.source / name).read_bytes()

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()


def _plain(name: str) -> bool:
    """A file name that stays inside the folder it is written to."""
    return name not in ("", ".", "..") and "\\" not in name and not name.startswith(".")


def _listing(reader: _Reader) -> dict[str, dict[str, list[str]]]:
    """``{split: {class: [member, ...]}}`` of a class-per-folder or Tiny-ImageNet source (hidden files left out)."""
    table: dict[str, dict[str, list[str]]] = {split: defaultdict(list) for split in SPLITS}
    notes = [n for n in reader.names if n == ANNOTATIONS or n.endswith("/" + ANNOTATIONS)]
    if notes:
        top = notes[0][: -len(ANNOTATIONS)]
        for n in reader.names:
            parts = n[len(top):].split("/") if n.startswith(top) else []
            if len(parts) == 4 and parts[0] == "train" and parts[2] == "images":
                table["train"][parts[1]].append(n)
        present = set(reader.names)
        for line in reader.read(notes[0]).decode("utf-8", "replace").splitlines():
            fields = line.split("\t")
            if len(fields) >= 2 and f"{top}val/images/{fields[0]}" in present:
                table["test"][fields[1]].append(f"{top}val/images/{fields[0]}")
        return table
    for n in reader.names:
        parts = PurePosixPath(n).parts
        for i, part in enumerate(parts[:-2]):
            if part in ("train", "test", "val") and i + 3 == len(parts):
                table["train" if part == "train" else "test"][parts[i + 1]].append(n)
    return table


def subset_digest(images: list[tuple[str, str, str, bytes]]) -> str:
    """The SHA-256 of ``(split, class, file name, bytes)`` rows in the order given."""
    digest = hashlib.sha256(b"sbcli-subset-1\n")
    for split, cls, name, data in images:
        digest.update(f"{split}/{cls}/{name}\n{hashlib.sha256(data).hexdigest()}\n".encode())
    return digest.hexdigest()


def write_subset(source: Path, spec: SubsetSpec, dest: Path,
                 on_image: Callable[[int, int], None] | None = None) -> Subset:
    """Copy the images ``spec`` names from ``source`` into ``dest/train/<class>/`` and ``dest/test/<class>/``.

    Raises:
        DataError: the source is missing or unreadable, or it lacks a class or enough images of one (one
            sentence, before anything is written).
    """
    reader = _Reader(Path(source))
    try:
        table = _listing(reader)
        chosen: list[tuple[str, str, str]] = []
        for split, count in (("train", spec.per_class), ("test", spec.test_per_class)):
            for cls in spec.classes:
                members = sorted((m for m in table[split].get(cls, []) if _plain(PurePosixPath(m).name)), key=lambda m: PurePosixPath(m).name)
                if len(members) < count:
                    raise DataError(f"{source} holds {len(members)} {split} images of class '{cls}' where {count} are "
                                    f"needed; give a copy of the data with every class's {split} images.")
                chosen += [(split, cls, m) for m in members[:count]]
        rows = []
        for i, (split, cls, member) in enumerate(chosen):
            data = reader.read(member)
            name = PurePosixPath(member).name
            (dest / split / cls).mkdir(parents=True, exist_ok=True)
            (dest / split / cls / name).write_bytes(data)
            rows.append((split, cls, name, data))
            if on_image is not None:
                on_image(i + 1, len(chosen))
    finally:
        reader.close()
    return Subset(dest / "train", dest / "test", subset_digest(rows), len(rows))
