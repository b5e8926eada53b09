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


def fingerprint(images: ImageSet) -> Fingerprint:
    """The fingerprint of a decoded set (about 0.3 s per 150 MB of pixels on one core)."""
    labels = images.labels.to(torch.int64).contiguous().cpu()
    counts = torch.bincount(labels, minlength=len(images.class_names)).tolist() if len(labels) else [0] * len(images.class_names)
    digest = hashlib.sha256()
    # a name that is not UTF-8 (surrogateescape, as os.listdir gives it) hashes as its bytes on disk
    digest.update(name_bytes(json.dumps(images.class_names, ensure_ascii=False)))
    digest.update(labels.numpy().tobytes())
    digest.update(memoryview(images.images.contiguous().cpu().numpy()).cast("B"))
    return Fingerprint(list(images.class_names), [int(c) for c in counts], digest.hexdigest())
