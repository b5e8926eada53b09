"""Tiny-ImageNet in its official layout, as a folder or straight from the official .zip."""

from __future__ import annotations

import stat
import zipfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sbcli.data import pixels, walk
from sbcli.data.imageset import ImageSet
from sbcli.data.sources.decode_cache import DecodeCache, fingerprint, stat_line
from sbcli.data.sources.decode import decode_many, is_image_name, to_imageset, walk_files
from sbcli.errors import DataError

TINY_IMAGENET_SIZE = 64


class _Tree(Protocol):
    """Read access to a Tiny-ImageNet tree, on disk or in a zip, by '/'-separated paths."""

    def read(self, rel: str) -> bytes:
        """The bytes of the file at ``rel``."""

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` is a file."""

    def files(self, rel_dir: str) -> list[str]:
        """The sorted paths of the files directly in ``rel_dir``."""

    def describe(self, rel: str) -> str:
        """``rel`` spelled for an error message."""

    def fingerprint(self) -> str:
        """A digest of the tree's files, sizes and mtimes."""


@dataclass(frozen=True)
class _DirTree:
    """A Tiny-ImageNet tree in a folder."""

    root: Path

    def read(self, rel: str) -> bytes:
        return pixels.read_image_file(self.root / rel)  # the text files too: all well under its cap

    def exists(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def files(self, rel_dir: str) -> list[str]:
        folder = self.root / rel_dir
        if not folder.is_dir():
            return []
        # not only regular files: a FIFO or a device named like an image is refused when read, not skipped
        return sorted(f"{rel_dir}/{p.name}" for p in folder.iterdir() if not p.is_dir())

    def describe(self, rel: str) -> str:
        return str(self.root / rel)

    def fingerprint(self) -> str:
        lines = [stat_line(p.relative_to(self.root).as_posix(), p) for p in walk_files(self.root)]
        return fingerprint(lines)


class _ZipTree:
    """A Tiny-ImageNet tree inside a zip, below ``prefix`` (e.g. ``"tiny-imagenet-200/"``)."""

    def __init__(self, path: Path, archive: zipfile.ZipFile, prefix: str) -> None:
        self.path, self.archive, self.prefix = path, archive, prefix
        self._files: set[str] = set()
        self._children: dict[str, list[str]] = defaultdict(list)
        for member in archive.namelist():
            if member.startswith(prefix) and not member.endswith("/"):
                rel = member[len(prefix) :]
                self._files.add(rel)
                self._children[rel.rpartition("/")[0]].append(rel)

    def read(self, rel: str) -> bytes:
        """The member's bytes, refused from its stated size before it is inflated (a zip bomb is small)."""
        info = self.archive.getinfo(self.prefix + rel)
        if info.file_size > pixels.MAX_IMAGE_BYTES:
            raise pixels.too_large(self.describe(rel), info.file_size)
        with self.archive.open(info) as member:  # ZipFile serialises concurrent reads itself
            data = member.read(pixels.MAX_IMAGE_BYTES + 1)  # the stated size could lie
        if len(data) > pixels.MAX_IMAGE_BYTES:
            raise pixels.too_large(self.describe(rel), len(data))
        return data

    def exists(self, rel: str) -> bool:
        return rel in self._files

    def files(self, rel_dir: str) -> list[str]:
        return sorted(self._children.get(rel_dir, []))

    def describe(self, rel: str) -> str:
        return f"{self.prefix}{rel} in {self.path}"

    def fingerprint(self) -> str:
        return fingerprint([stat_line(self.prefix, self.path)])


def load_tiny_imagenet(path: Path, train: bool, *, cache: DecodeCache | None) -> ImageSet:
    """Load Tiny-ImageNet (or a subset of its classes) from the official layout.

    The layout is ``wnids.txt``, ``words.txt``, ``train/<wnid>/images/*.JPEG`` and
    ``val/images/*.JPEG`` with ``val/val_annotations.txt``; the val split is the test set.
    Labels follow the sorted wnids; a class is named by the first name ``words.txt`` gives its
    wnid (``"goldfish"``), with ``_<wnid>`` appended to names that two classes share.

    Args:
        path: the dataset folder, a folder holding exactly one such folder, or the official
            zip (read in place, without extracting it).
        train: the train split, else the val split.
        cache: where decoded data is kept between runs, or None to always decode.

    Returns:
        64x64 images.

    Raises:
        DataError: the path or a required file is missing, a file is malformed, or an image
            cannot be decoded.
    """
    path = Path(path).expanduser()
    kind = f"tiny-imagenet:{'train' if train else 'val'}"
    with _open_tiny_tree(path) as tree:
        if cache is None:
            return _decode_tiny(tree, train)
        key = DecodeCache.key(kind, path, TINY_IMAGENET_SIZE, tree.fingerprint())
        hit = cache.get(key)
        if hit is not None:
            return hit[0]
        data = _decode_tiny(tree, train)
    cache.put(key, data)
    return data


def _decode_tiny(tree: _Tree, train: bool) -> ImageSet:
    """Read the class list and decode one split of an opened tree."""
    wnids = _read_wnids(tree)
    class_names = _tiny_class_names(tree, wnids)
    keys, labels = _tiny_train_items(tree, wnids) if train else _tiny_val_items(tree, wnids)
    return to_imageset(decode_many(keys, tree.read, tree.describe, TINY_IMAGENET_SIZE), labels, class_names)


@contextmanager
def _open_tiny_tree(path: Path) -> Iterator[_Tree]:
    """Open ``path`` as a Tiny-ImageNet tree (folder, parent folder, or zip)."""
    if not path.exists():
        raise DataError(f"Tiny-ImageNet not found at {path}; pass the dataset folder or its .zip.")
    if path.is_dir():
        yield _DirTree(_find_tiny_root(path))
        return
    mode = walk.stat(path).st_mode
    if not stat.S_ISREG(mode):  # opening a FIFO would wait forever for a writer
        raise DataError(f"{path} is {pixels.file_kind(path, mode)}, not a zip file; "
                        "pass the Tiny-ImageNet folder or its official .zip.")
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise DataError(
            f"{path} is not a readable zip file ({err}); pass the Tiny-ImageNet folder or its official .zip."
        ) from err
    with archive:
        yield _ZipTree(path, archive, _find_zip_prefix(path, archive))


def _find_tiny_root(path: Path) -> Path:
    """``path`` if it holds ``wnids.txt``, else its one subfolder that does."""
    if (path / "wnids.txt").is_file():
        return path
    found = sorted(p for p in path.iterdir() if (p / "wnids.txt").is_file())
    if len(found) != 1:
        why = "no subfolder holds" if not found else f"{len(found)} subfolders hold"
        raise DataError(
            f"{path} is not a Tiny-ImageNet folder: it has no wnids.txt and {why} one; pass the folder that holds wnids.txt."
        )
    return found[0]


def _find_zip_prefix(path: Path, archive: zipfile.ZipFile) -> str:
    """The folder inside the zip that holds ``wnids.txt`` ("" for the zip's top)."""
    prefixes = [m[: -len("wnids.txt")] for m in archive.namelist() if m == "wnids.txt" or m.endswith("/wnids.txt")]
    if len(prefixes) != 1:
        raise DataError(f"{path} holds {len(prefixes)} wnids.txt files, not one; pass the official Tiny-ImageNet zip.")
    return prefixes[0]


def _read_text(tree: _Tree, rel: str) -> str:
    """A required text file of the tree."""
    if not tree.exists(rel):
        raise DataError(f"{tree.describe(rel)} is missing; pass a complete Tiny-ImageNet folder or zip.")
    return tree.read(rel).decode("utf-8")


def _read_wnids(tree: _Tree) -> list[str]:
    """The sorted class ids of ``wnids.txt``."""
    wnids = sorted({line.strip() for line in _read_text(tree, "wnids.txt").splitlines() if line.strip()})
    if not wnids:
        raise DataError(f"{tree.describe('wnids.txt')} lists no classes; put one wnid per line in it.")
    return wnids


def _tiny_class_names(tree: _Tree, wnids: list[str]) -> list[str]:
    """The first ``words.txt`` name of each wnid, made unique by appending the wnid."""
    words: dict[str, str] = {}
    for line in _read_text(tree, "words.txt").splitlines():
        wnid, _, names = line.partition("\t")
        words[wnid.strip()] = names.split(",")[0].strip()
    missing = [w for w in wnids if not words.get(w)]
    if missing:
        raise DataError(
            f"{tree.describe('words.txt')} has no name for {missing[0]}; use the words.txt of the official release."
        )
    counts = Counter(words[w] for w in wnids)
    return [words[w] if counts[words[w]] == 1 else f"{words[w]}_{w}" for w in wnids]


def _tiny_train_items(tree: _Tree, wnids: list[str]) -> tuple[list[str], list[int]]:
    """The training images and labels: ``train/<wnid>/images/*``."""
    keys: list[str] = []
    labels: list[int] = []
    for label, wnid in enumerate(wnids):
        images = [rel for rel in tree.files(f"train/{wnid}/images") if is_image_name(rel)]
        if not images:
            raise DataError(
                f"No images found in {tree.describe(f'train/{wnid}/images')}; put the training images of {wnid} there."
            )
        keys += images
        labels += [label] * len(images)
    return keys, labels


def _tiny_val_items(tree: _Tree, wnids: list[str]) -> tuple[list[str], list[int]]:
    """The val images and labels, from ``val/val_annotations.txt``."""
    label_of = {wnid: i for i, wnid in enumerate(wnids)}
    where = tree.describe("val/val_annotations.txt")
    keys: list[str] = []
    labels: list[int] = []
    for number, line in enumerate(_read_text(tree, "val/val_annotations.txt").splitlines(), start=1):
        fields = line.split("\t")
        if not line.strip():
            continue
        if len(fields) < 2 or fields[1] not in label_of:
            raise DataError(
                f"Line {number} of {where} does not name an image and a class of wnids.txt; use the official annotation file."
            )
        rel = f"val/images/{fields[0]}"
        if not tree.exists(rel):
            raise DataError(f"{tree.describe(rel)}, listed in {where}, is missing; restore it or remove its line.")
        keys.append(rel)
        labels.append(label_of[fields[1]])
    if not keys:
        raise DataError(f"{where} lists no images; use the official annotation file.")
    return keys, labels

