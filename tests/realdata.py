"""Where the tests find the real image archives: one setting, ``SBCLI_TEST_DATA``.

The folder holds ``cifar10-jpeg.zip``, ``tiny-imagenet-100.zip`` and ``tiny-imagenet-100-32px.zip``
(docs/lab/benchmarks.md says what each is). Unset, it is ``../shared/data`` beside the checkout. Tests
that need an archive skip, with its path, where it is absent; nothing is copied into the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DATA_DIR = Path(os.environ.get("SBCLI_TEST_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


def archive_path(name: str) -> Path:
    """The path of archive ``name`` in the test data folder (it may not exist)."""
    return DATA_DIR / name


def require_archive(name: str) -> Path:
    """The archive's path, or a skip that names where it was looked for and the setting that moves it."""
    path = archive_path(name)
    if not path.is_file():
        pytest.skip(f"real data absent: {path} (set SBCLI_TEST_DATA to the folder holding {name})")
    return path
