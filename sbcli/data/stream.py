"""A class-per-folder set read in batches, never whole: memory that does not grow with the number of images.

A frozen backbone needs each new image once, for its pooled feature. :class:`FolderStream` lists the
images (the same listing and checks as :func:`sbcli.data.sources.load_folder`) and gives them back in
batches of decoded uint8 pixels, the next batch decoded on a thread pool while the caller passes the
current one through the backbone; the fingerprint of the whole set is computed batch by batch and is
the one :func:`sbcli.data.fingerprint.fingerprint` gives for the decoded set
(:class:`sbcli.data.fingerprint.RunningFingerprint`). Nothing is kept but the
labels: the caller keeps what it makes of each batch (features, sums).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sbcli.data.sources.decode import _worker_count, decode_many
from sbcli.data.sources.folder import _read_path, _scan_folder
from sbcli.errors import ConfigError

BATCH = 256  # images decoded at a time: 38 MB of uint8 pixels at 224 px


@dataclass
class FolderStream:
    """The images of a class-per-folder tree, listed, decoded on demand in batches.

    Attributes:
        root: the folder (one subfolder per class).
        image_size: the side of the square images returned.
        class_names: the sorted class folder names (the folder's label order).
        files: every image, in label order.
        labels: int64 [N], each file's label in ``class_names``.
        skipped: files that are not images by their extension.
    """

    root: Path
    image_size: int
    class_names: list[str]
    files: list[Path]
    labels: torch.Tensor
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def scan(cls, root: Path, image_size: int) -> FolderStream:
        """List ``root`` (refusing what :func:`sbcli.data.sources.load_folder` refuses), decoding nothing.

        Raises:
            DataError: a missing folder, no class folders, an empty class, a file that is not a regular file.
            ConfigError: ``image_size`` is not positive.
        """
        if image_size < 1:
            raise ConfigError(f"Image size must be at least 1 pixel, got {image_size}; pass a positive image size.")
        listing = _scan_folder(Path(root).expanduser())
        return cls(Path(root), image_size, list(listing.class_names), list(listing.files),
                   torch.as_tensor(np.asarray(listing.labels, dtype=np.int64)), list(listing.skipped))

    def __len__(self) -> int:
        return len(self.files)

    def decoded_bytes(self) -> int:
        """What the whole set takes decoded (uint8 pixels): what a method that holds it needs at least."""
        return len(self.files) * 3 * self.image_size * self.image_size

    def batches(self, size: int = BATCH, each: Callable[[torch.Tensor], None] | None = None
                ) -> Iterator[tuple[int, torch.Tensor]]:
        """``(first row, uint8 [B, 3, S, S])`` for consecutive batches, the next one decoded meanwhile.

        ``each`` is called with every batch, in order, on the decoding thread once it is decoded (what a running
        fingerprint reads): it overlaps the caller's work on the batch before.

        Raises:
            DataError: an image cannot be read or decoded (the message names it).
        """
        keys = [str(p) for p in self.files]
        spans = [(i, min(i + size, len(keys))) for i in range(0, len(keys), size)]
        with ThreadPoolExecutor(max_workers=1) as ahead:  # decode_many itself uses every CPU's thread
            pending: Future | None = None
            for n, (lo, hi) in enumerate(spans):
                if pending is None:
                    pending = ahead.submit(self._decode, keys[lo:hi], each)
                current = pending.result()
                if n + 1 < len(spans):
                    pending = ahead.submit(self._decode, keys[spans[n + 1][0]:spans[n + 1][1]], each)
                yield lo, current

    def _decode(self, keys: list[str], each: Callable[[torch.Tensor], None] | None) -> torch.Tensor:
        images = torch.from_numpy(decode_many(keys, _read_path, str, self.image_size,
                                              doing=f"Decoding images in {self.root}"))
        if each is not None:
            each(images)
        return images


def decode_threads() -> int:
    """The threads a batch is decoded with (every CPU this process may use, up to 16)."""
    return _worker_count()
