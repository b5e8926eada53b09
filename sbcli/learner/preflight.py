"""Checks of the environment before training: a writable place with room for the save.

A read-only directory or a full disk is reported before an hour of training, not after it:
:func:`check_writable` creates (and removes) a probe file where the learner will be written, and
:func:`check_free_space` compares the free bytes there with :func:`save_bytes`, an estimate of
what one save writes (weights, exemplars, JSON) with a margin.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from sbcli.errors import LearnerError

MARGIN = 1.25  # the estimate's slack: safetensors headers, JSON, a file system's blocks
FIXED_BYTES = 4 << 20  # learner.json, README.md and the like


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing ancestor (where a new learner's directory would be created)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(directory: Path) -> None:
    """Refuse at once when ``directory`` (or, for a new one, its nearest existing parent) cannot be written.

    Raises:
        LearnerError: one sentence naming the directory and the reason.
    """
    where = _existing(directory)
    if not where.is_dir():
        raise LearnerError(f"{where} is a file, so the learner cannot be written to {directory}; choose another path.")
    try:
        fd, probe = tempfile.mkstemp(prefix=".sbcli-probe-", dir=where)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise LearnerError(f"The learner cannot be written to {directory}: {where} is not writable "
                           f"({err.strerror or err}); choose a writable place or fix its permissions "
                           "(nothing was trained).") from err


def check_free_space(directory: Path, need: int) -> None:
    """Refuse when the file system of ``directory`` has fewer than ``need`` bytes free.

    Raises:
        LearnerError: one sentence with what is needed and what is free.
    """
    where = _existing(directory)
    free = shutil.disk_usage(where).free
    if free < need:
        raise LearnerError(f"Not enough free space for the learner at {directory}: a save needs about "
                           f"{_mib(need)} and {where} has {_mib(free)} free; free some space or choose another "
                           "place (nothing was trained).")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def save_bytes(arch: str, width: float, num_classes: int, image_size: int, budget: int) -> int:
    """About how many bytes one save of such a learner writes (the network built on ``meta``: no allocation)."""
    from sbcli.nets.meta import meta_model

    weights = meta_model(arch, num_classes, width).state_dict()
    model = sum(t.numel() * t.element_size() for t in weights.values())
    memory = budget * (3 * image_size * image_size + 8)
    return int((model + memory) * MARGIN) + FIXED_BYTES
