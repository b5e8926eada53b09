"""The decode cache: decoded data sets on disk, so that a second run does not decode again."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch

from sbcli.atomic import replacing, write_atomic
from sbcli.data import walk
from sbcli.data.imageset import ImageSet

logger = logging.getLogger(__name__)

_CACHE_FORMAT = 1  # bump when decoding changes, so that old cache entries stop matching


@dataclass(frozen=True)
class DecodeCache:
    """Decoded data sets on disk, so that a second run does not decode again.

    An entry is ``<key>.safetensors`` (``images`` uint8, ``labels`` int64) plus ``<key>.json``
    (class names and what the loader reports besides), each written to a temporary file and
    moved into place with ``os.replace``. The key (:meth:`key`) covers the source kind, the
    resolved path, the image size and a fingerprint of the source files (names, sizes, mtimes),
    so an edited source misses the cache. An unreadable or inconsistent entry is a miss: it is
    decoded again and overwritten.

    Attributes:
        directory: where the entries live.
    """

    directory: Path

    @classmethod
    def default(cls) -> DecodeCache:
        """The cache at ``$SBCLI_CACHE``, else ``$XDG_CACHE_HOME/sbcli/decoded``, else ``~/.cache/sbcli/decoded``."""
        if os.environ.get("SBCLI_CACHE"):
            return cls(Path(os.environ["SBCLI_CACHE"]).expanduser())
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
        return cls(base / "sbcli" / "decoded")

    @staticmethod
    def key(kind: str, path: Path, image_size: int, fingerprint: str) -> str:
        """The hex sha256 naming an entry.

        Args:
            kind: the source and split, e.g. ``"folder"`` or ``"tiny-imagenet:val"``.
            path: the source path (resolved here).
            image_size: the decoded resolution.
            fingerprint: a digest of the source files' names, sizes and mtimes.
        """
        parts = [_CACHE_FORMAT, kind, str(Path(path).resolve()), int(image_size), fingerprint]
        return hashlib.sha256(json.dumps(parts).encode("utf-8")).hexdigest()

    def get(self, key: str) -> tuple[ImageSet, dict[str, Any]] | None:
        """The entry under ``key`` and its extra metadata, or None when absent or unusable."""
        tensor_path, meta_path = self._paths(key)
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            tensors = safetensors.torch.load_file(tensor_path)
        # A missing, truncated or garbled entry is a miss (json/unicode errors are ValueErrors).
        except (OSError, ValueError, safetensors.SafetensorError):
            return None
        return _entry_from(meta, tensors)

    def put(self, key: str, data: ImageSet, extra: dict[str, Any] | None = None) -> None:
        """Store ``data`` (and JSON-able ``extra``) under ``key``; failure to write only logs a warning."""
        tensor_path, meta_path = self._paths(key)
        meta = {
            "format": _CACHE_FORMAT,
            "class_names": list(data.class_names),
            "count": len(data),
            "extra": extra or {},
        }
        tensors = {"images": data.images.contiguous(), "labels": data.labels.contiguous()}
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with replacing(tensor_path) as tmp:
                safetensors.torch.save_file(tensors, tmp)
            write_atomic(meta_path, json.dumps(meta))
        except OSError as err:
            # The cache only saves time: a read-only or full disk must not fail the load.
            logger.warning(
                "Could not write the decode cache in %s (%s); the data will be decoded again next time.",
                self.directory,
                err,
            )

    def _paths(self, key: str) -> tuple[Path, Path]:
        """The tensor file and the metadata file of ``key``."""
        return self.directory / f"{key}.safetensors", self.directory / f"{key}.json"


def _entry_from(meta: object, tensors: dict[str, torch.Tensor]) -> tuple[ImageSet, dict[str, Any]] | None:
    """Rebuild a cache entry, or None when its two files do not fit together."""
    if not isinstance(meta, dict) or meta.get("format") != _CACHE_FORMAT:
        return None
    names, extra = meta.get("class_names"), meta.get("extra")
    images, labels = tensors.get("images"), tensors.get("labels")
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names) and isinstance(extra, dict)):
        return None
    if images is None or labels is None or images.dtype != torch.uint8 or labels.dtype != torch.int64:
        return None
    if (
        images.ndim != 4
        or images.shape[1] != 3
        or labels.shape != (images.shape[0],)
        or meta.get("count") != len(labels)
    ):
        return None
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= len(names)):
        return None
    return ImageSet(images, labels, names), extra


def fingerprint(lines: Sequence[str]) -> str:
    """A digest of a file listing (one ``name\\tsize\\tmtime_ns`` line per file)."""
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


def stat_line(name: str, path: Path, st: os.stat_result | None = None) -> str:
    """The fingerprint line of one file (from ``st`` when the caller already has its stat)."""
    st = walk.stat(path) if st is None else st
    return f"{name}\t{st.st_size}\t{st.st_mtime_ns}"

