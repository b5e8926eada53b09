"""Checks of the environment before training: a writable place with room for the save, memory for the images.

A read-only directory or a full disk is reported before an hour of training, not after it:
:func:`check_writable` creates (and removes) a probe file where the learner will be written, and
:func:`check_free_space` compares the free bytes there with :func:`save_bytes`, an estimate of
what one save writes (weights, exemplars, JSON) with a margin. :func:`check_memory` refuses a step
whose decoded images would not fit in the memory available, with its estimate, before any is decoded.
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


def available_memory() -> int | None:
    """The bytes of memory this machine can give without swapping (``MemAvailable``), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(need: int, what: str) -> None:
    """Refuse before any work when ``need`` bytes (``what`` holds them) exceed the memory available now.

    Raises:
        LearnerError: one sentence with the estimate, what is available, and what to do.
    """
    free = available_memory()
    if free is not None and need > free:
        raise LearnerError(f"{what[0].upper()}{what[1:]} would take about {_gib(need)} of memory and this machine has "
                           f"{_gib(free)} available; add the classes in smaller tasks (fewer images a task) or run on "
                           "a machine with more memory (nothing was learned).")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def save_bytes(arch: str, width: float, num_classes: int, image_size: int, budget: int) -> int:
    """About how many bytes one save of such a learner writes (the network built on ``meta``: no allocation)."""
    from sbcli.nets.meta import meta_model

    weights = meta_model(arch, num_classes, width).state_dict()
    model = sum(t.numel() * t.element_size() for t in weights.values())
    memory = budget * (3 * image_size * image_size + 8)
    return int((model + memory) * MARGIN) + FIXED_BYTES
