"""Where the tests find the real image archives: one setting, ``SBCLI_TEST_DATA``, and no default.

The folder holds ``cifar10-jpeg.zip``, ``tiny-imagenet-100.zip`` and ``tiny-imagenet-100-32px.zip``
(docs/lab/benchmarks.md says what each is). Tests that need an archive skip, naming the setting and
the path, where it is unset or the archive is absent; nothing is copied into the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SETTING = "SBCLI_TEST_DATA"
DATA_DIR: Path | None = Path(os.environ[SETTING]) if os.environ.get(SETTING) else None
# Where an archive is looked for while the setting is unset: a relative path named after the setting
# (no folder of that name exists), so that "absent: $SBCLI_TEST_DATA/x.zip" says what to set.
UNSET = Path(f"${SETTING}")


def archive_path(name: str) -> Path:
    """The path of archive ``name`` in the test data folder (it may not exist; never does while unset)."""
    return (DATA_DIR or UNSET) / name


def require_archive(name: str) -> Path:
    """The archive's path, or a skip that names the setting and where the archive was looked for."""
    if DATA_DIR is None:
        pytest.skip(f"real data absent: {SETTING} is unset (set it to the folder holding {name})")
    path = archive_path(name)
    if not path.is_file():
        pytest.skip(f"real data absent: {path} (set {SETTING} to the folder holding {name})")
    return path
