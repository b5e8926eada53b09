"""What a data set is, without where it is: class names, image counts and a content hash.

A learner records the fingerprint of every source it learned from (train and test split), never
the path it was read from, so that it can travel: on another machine, or after a folder moved,
a folder is recognised as "the same test set" when its fingerprint matches.

The content hash is the SHA-256 of the class names, the labels and the decoded uint8 pixels at
the training resolution, so it names exactly what the learner saw (not the file bytes: the same
images re-saved losslessly match, a resized or edited image does not).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import torch

from sbcli.data.imageset import ImageSet
from sbcli.data.names import name_bytes


@dataclass(frozen=True)
class Fingerprint:
    """Class names in label order, images per class, and the content hash."""

    classes: list[str]
    counts: list[int]
    sha256: str

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Fingerprint:
        return cls(list(data["classes"]), [int(c) for c in data["counts"]], str(data["sha256"]))

    @property
    def images(self) -> int:
        return sum(self.counts)


class RunningFingerprint:
    """:func:`fingerprint` of a set whose pixels come batch by batch, in order (a streamed folder)."""

    def __init__(self, class_names: list[str], labels: torch.Tensor) -> None:
        self.class_names = list(class_names)
        self.labels = labels.to(torch.int64).contiguous().cpu()
        self.digest = hashlib.sha256()
        # a name that is not UTF-8 (surrogateescape, as os.listdir gives it) hashes as its bytes on disk
        self.digest.update(name_bytes(json.dumps(self.class_names, ensure_ascii=False)))
        self.digest.update(self.labels.numpy().tobytes())

    def update(self, images: torch.Tensor) -> None:
        self.digest.update(memoryview(images.contiguous().cpu().numpy()).cast("B"))

    def result(self) -> Fingerprint:
        n = len(self.class_names)
        counts = torch.bincount(self.labels, minlength=n).tolist() if len(self.labels) else [0] * n
        return Fingerprint(list(self.class_names), [int(c) for c in counts], self.digest.hexdigest())


def fingerprint(images: ImageSet) -> Fingerprint:
    """The fingerprint of a decoded set (about 0.3 s per 150 MB of pixels on one core)."""
    running = RunningFingerprint(images.class_names, images.labels)
    running.update(images.images)
    return running.result()
