"""Pooled features of test images under a frozen backbone, kept on disk: a step of a frozen-backbone method
(``--method ranpac``, ``simplecil``) pays the backbone's forward pass for the images it has not seen, not
for every old test image again.

A frozen method's scores are a small head on the backbone's pooled features, and its head changes every
step while its backbone does not. So the features of a test set are computed once and the head is applied
to them. An entry holds the features of one class's test images and is named by what determines them:
the backbone's tensors (every one but the growing head's), the normalisation, the device type (CPU and
GPU kernels differ in the last bits) and the images themselves, byte for byte. A changed backbone, other
images or another device miss; a changed class order does not matter. Entries are files of their own,
written by one rename, under the decode cache (``$SBCLI_CACHE/features``, else
``~/.cache/sbcli/decoded/features``); an unreadable entry is computed again, a cache that cannot be
written only costs time (a warning). Deleting the folder is always safe.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import safetensors
import safetensors.torch
import torch
from torch import nn

from sbcli.atomic import replacing
from sbcli.data.sources import DecodeCache

logger = logging.getLogger(__name__)

FORMAT = 1  # bump when what a feature is changes (pooling, precision), so that old entries stop matching
FOLDER = "features"
HEAD_PREFIX = "head."  # the growing classifier: not part of what the features depend on


def backbone_fingerprint(model: nn.Module) -> str:
    """The sha256 of every tensor of ``model`` but its head's (names, dtypes, shapes and bytes)."""
    digest = hashlib.sha256(f"sbcli-backbone-{FORMAT}".encode())
    for name, tensor in sorted(model.state_dict().items()):
        if name.startswith(HEAD_PREFIX):
            continue
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        digest.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))  # the bytes, not a copy of them
    return digest.hexdigest()


@dataclass(frozen=True)
class FeatureCache:
    """Features of test images by backbone and content, one entry per class (:func:`features`)."""

    directory: Path

    @classmethod
    def default(cls) -> FeatureCache:
        """``features`` under the decode cache (``$SBCLI_CACHE``, else ``~/.cache/sbcli/decoded``)."""
        return cls(DecodeCache.default().directory / FOLDER)

    def features(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor, context: dict,
                 compute: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Pooled features [N, D] (float32, CPU) of ``images`` under ``model``'s backbone.

        Each class's images (by ``labels``) are one entry; the classes the cache lacks are computed in one
        call of ``compute(images)`` and stored. ``context`` is JSON of what else the features depend on
        (normalisation, device type).
        """
        labels = labels.cpu()
        prefix = json.dumps([FORMAT, backbone_fingerprint(model), context], sort_keys=True).encode()
        out = torch.empty(len(images), model.num_features)
        missing: list[tuple[torch.Tensor, str]] = []
        for label in labels.unique().tolist():
            index = (labels == label).nonzero().flatten()
            key = _key(prefix, images[index])
            cached = self._get(key, len(index), model.num_features)
            if cached is None:
                missing.append((index, key))
            else:
                out[index] = cached
        if missing:
            computed = compute(images[torch.cat([index for index, _ in missing])]).float().cpu()
            parts = computed.split([len(i) for i, _ in missing])
            for (index, _), part in zip(missing, parts, strict=True):
                out[index] = part
            self._put_all([(key, part) for (_, key), part in zip(missing, parts, strict=True)])
        return out

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.safetensors"

    def _get(self, key: str, count: int, width: int) -> torch.Tensor | None:
        try:
            features = safetensors.torch.load_file(self._path(key)).get("features")
        except (FileNotFoundError, NotADirectoryError):  # never written (or no cache folder there): a miss
            return None
        except (OSError, ValueError, safetensors.SafetensorError) as err:  # damaged: computed again, overwritten
            logger.warning("The feature cache entry %s is unreadable (%s); computing it again.", self._path(key), err)
            return None
        if features is None or features.dtype != torch.float32 or tuple(features.shape) != (count, width):
            logger.warning("The feature cache entry %s does not fit its images; computing it again.", self._path(key))
            return None
        return features

    def _put_all(self, entries: list[tuple[str, torch.Tensor]]) -> None:
        """Store each entry; the first failure ends the writing with one warning."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for key, features in entries:
                with replacing(self._path(key)) as tmp:
                    safetensors.torch.save_file({"features": features.contiguous()}, tmp)
        except OSError as err:  # the cache only saves time: a read-only or full disk must not fail the step
            logger.warning("Could not write the feature cache in %s (%s); the features will be computed again "
                           "next time.", self.directory, err)


def _key(prefix: bytes, images: torch.Tensor) -> str:
    digest = hashlib.sha256(prefix)
    digest.update(f"{images.dtype}|{tuple(images.shape)}".encode())
    digest.update(memoryview(images.detach().cpu().contiguous().numpy()).cast("B"))
    return digest.hexdigest()
