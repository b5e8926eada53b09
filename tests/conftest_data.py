"""Real-data fixtures: CIFAR-10 (JPEG re-encode) from the test data folder, unzipped under pytest's tmp dir.

Registered for every test by ``pytest_plugins`` in tests/conftest.py. The folder
is ``SBCLI_TEST_DATA`` (tests/realdata.py); tests that use them skip, with the reason, where the
archive is absent. Nothing is copied into the repository.

* ``cifar10_zip``: the archive's path (skips when absent).
* ``cifar10_subset``: a factory that unzips only the first N train / test images of the classes
  asked for, as class-per-folder trees: about a second, where the whole archive (60,000 files) takes
  10 s on a quiet disk and over a minute on a busy one.
* ``cifar10_jpeg``: the whole ``cifar10-jpeg/`` folder, for tests that need every image.
"""

from __future__ import annotations

import zipfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from realdata import archive_path, require_archive

CIFAR10_ZIP = archive_path("cifar10-jpeg.zip")
PREFIX = "cifar10-jpeg"

SubsetFn = Callable[[list[str], int, int], tuple[Path, Path]]


@pytest.fixture(scope="session")
def cifar10_zip() -> Path:
    return require_archive(CIFAR10_ZIP.name)


@pytest.fixture(scope="session")
def cifar10_jpeg(cifar10_zip: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole unzipped ``cifar10-jpeg/`` folder (``train/<class>/*.jpg``, ``test/<class>/*.jpg``)."""
    root = tmp_path_factory.mktemp("cifar10")
    with zipfile.ZipFile(cifar10_zip) as archive:
        archive.extractall(root)
    return root / PREFIX


def extract_subset(archive: zipfile.ZipFile, split: str, classes: list[str], per_class: int, target: Path) -> Path:
    """Unzip the first ``per_class`` images (in name order) of each class of ``split`` into ``target/<class>/``."""
    members: dict[str, list[str]] = defaultdict(list)
    for name in archive.namelist():
        parts = name.split("/")
        if len(parts) == 4 and parts[1] == split and parts[2] in classes and parts[3]:
            members[parts[2]].append(name)
    for cls in classes:
        if not members[cls]:
            raise ValueError(f"{CIFAR10_ZIP} has no {split} images of class {cls!r}")
        (target / cls).mkdir(parents=True, exist_ok=True)
        for name in sorted(members[cls])[:per_class]:
            (target / cls / Path(name).name).write_bytes(archive.read(name))
    return target


@pytest.fixture(scope="session")
def cifar10_subset(cifar10_zip: Path, tmp_path_factory: pytest.TempPathFactory) -> SubsetFn:
    """A factory: ``(classes, train_per_class, test_per_class) -> (train_dir, test_dir)``, class-per-folder."""

    def make(classes: list[str], train_per_class: int, test_per_class: int) -> tuple[Path, Path]:
        root = tmp_path_factory.mktemp("c10-" + "-".join(classes))
        with zipfile.ZipFile(cifar10_zip) as archive:
            train = extract_subset(archive, "train", classes, train_per_class, root / "train")
            test = extract_subset(archive, "test", classes, test_per_class, root / "test")
        return train, test

    return make
