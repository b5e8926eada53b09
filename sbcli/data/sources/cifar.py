"""CIFAR-10/100 in torchvision's on-disk format (``cifar-*-python``)."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from sbcli.data.imageset import ImageSet
from sbcli.data.sources.decode import to_imageset
from sbcli.errors import DataError, UnknownNameError

if TYPE_CHECKING:
    from torchvision.datasets import CIFAR10

logger = logging.getLogger(__name__)

CIFAR_SIZE = 32


def load_cifar(root: Path, name: Literal["cifar10", "cifar100"], train: bool, *, download: bool) -> ImageSet:
    """Load CIFAR-10 or CIFAR-100 from torchvision's on-disk format.

    ``root`` holds ``cifar-10-batches-py/`` or ``cifar-100-python/`` (the folder itself is
    accepted too). Files whose md5 matches the official release are loaded by
    ``torchvision.datasets.CIFAR10/CIFAR100``. Files in the same format that do not match
    (a re-pickled or reduced copy, or only one split present) fail torchvision's integrity
    check, which covers both splits; they are read here instead, with an unpickler that allows
    numpy arrays only, their structure checked, and a logged warning that they are not the
    official files.

    Args:
        root: the folder that holds (or will hold) the dataset folder.
        name: ``"cifar10"`` or ``"cifar100"`` (fine labels).
        train: the training split, else the test split.
        download: let torchvision download and extract the archive when the files are missing
            or differ from the official ones.

    Returns:
        32x32 images with the class names of the meta file.

    Raises:
        DataError: the files are missing (and ``download`` is False), malformed, or the
            download failed.
        UnknownNameError: ``name`` is not a CIFAR variant.
    """
    dataset_cls = _cifar_class(name)
    root = Path(root).expanduser()
    if root.name == dataset_cls.base_folder:
        root = root.parent
    if download:
        return _cifar_via_torchvision(dataset_cls, root, train, download=True)
    _require_cifar_files(dataset_cls, root, name, train)
    mismatched = [
        file
        for file, md5 in _cifar_checksums(dataset_cls)
        if not _md5_matches(root / dataset_cls.base_folder / file, md5)
    ]
    if not mismatched:
        return _cifar_via_torchvision(dataset_cls, root, train, download=False)
    logger.warning(
        "%s in %s differ from the official %s release (md5 mismatch or file absent), which torchvision "
        "refuses; reading the files with sbcli's checked reader instead.",
        ", ".join(mismatched),
        root / dataset_cls.base_folder,
        name,
    )
    return _read_cifar(dataset_cls, root, train)


def _cifar_class(name: str) -> type[CIFAR10]:
    """The torchvision dataset class of ``name`` (imported here: torchvision is slow to import)."""
    from torchvision.datasets import CIFAR10, CIFAR100

    classes = {"cifar10": CIFAR10, "cifar100": CIFAR100}
    if name not in classes:
        raise UnknownNameError("CIFAR dataset", name, list(classes))
    return classes[name]


def _cifar_batches(dataset_cls: type[CIFAR10], train: bool) -> list[str]:
    """The batch files of one split."""
    return [file for file, _ in (dataset_cls.train_list if train else dataset_cls.test_list)]


def _cifar_files(dataset_cls: type[CIFAR10], train: bool) -> list[str]:
    """The files one split needs: its batches and the meta file."""
    return _cifar_batches(dataset_cls, train) + [dataset_cls.meta["filename"]]


def _cifar_checksums(dataset_cls: type[CIFAR10]) -> list[tuple[str, str]]:
    """(file, md5) of every file torchvision checks: both splits and the meta file."""
    pairs = dataset_cls.train_list + dataset_cls.test_list + [[dataset_cls.meta["filename"], dataset_cls.meta["md5"]]]
    return [(file, md5) for file, md5 in pairs]


def _md5_matches(path: Path, md5: str) -> bool:
    """Whether ``path`` exists with the given md5 (torchvision's own check)."""
    from torchvision.datasets.utils import check_integrity

    return check_integrity(str(path), md5)


def _require_cifar_files(dataset_cls: type[CIFAR10], root: Path, name: str, train: bool) -> None:
    """Raise a :class:`DataError` saying where the data goes when a needed file is missing."""
    folder = root / dataset_cls.base_folder
    missing = [file for file in _cifar_files(dataset_cls, train) if not (folder / file).is_file()]
    if missing:
        raise DataError(
            f"{name} not found: {folder / missing[0]} is missing; extract {dataset_cls.filename} "
            f"from {dataset_cls.url} into {root}, or allow downloading (download=True, --download)."
        )


def _cifar_via_torchvision(dataset_cls: type[CIFAR10], root: Path, train: bool, *, download: bool) -> ImageSet:
    """Load through torchvision, downloading first when asked."""
    if download:
        dataset = _download_cifar(dataset_cls, root, train)
    else:
        dataset = dataset_cls(str(root), train=train, download=False)
    images = torch.from_numpy(np.ascontiguousarray(dataset.data.transpose(0, 3, 1, 2)))
    return ImageSet(images, torch.as_tensor(dataset.targets, dtype=torch.int64), list(dataset.classes))


def _download_cifar(dataset_cls: type[CIFAR10], root: Path, train: bool) -> CIFAR10:
    """Let torchvision download and extract the archive unless the official files are there."""
    try:
        return dataset_cls(str(root), train=train, download=True)
    # URLError is an OSError; torchvision raises RuntimeError for an archive with the wrong md5.
    except (OSError, RuntimeError) as err:
        raise DataError(
            f"Could not download {dataset_cls.filename} into {root} ({err}); check the network "
            f"connection, or download it from {dataset_cls.url} and extract it there yourself."
        ) from err


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays, nothing else: the files are unverified."""

    _ALLOWED = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("_codecs", "encode"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        """Resolve only the globals a numpy array needs."""
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in CIFAR data")
        return super().find_class(module, name)


def _unpickle_cifar(path: Path) -> dict[str, Any]:
    """Read one CIFAR pickle (Python 2 strings decoded as latin-1, as torchvision does)."""
    try:
        with path.open("rb") as f:
            entry = _ArrayUnpickler(f, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError) as err:
        raise DataError(
            f"{path} is not a CIFAR pickle ({err}); replace it with the file from the official archive."
        ) from err
    if not isinstance(entry, dict):
        raise DataError(
            f"{path} is not a CIFAR pickle (it holds a {type(entry).__name__}); replace it with the file from the official archive."
        )
    return entry


def _read_cifar(dataset_cls: type[CIFAR10], root: Path, train: bool) -> ImageSet:
    """Read CIFAR pickles without torchvision, checking their structure."""
    folder = root / dataset_cls.base_folder
    meta_path = folder / dataset_cls.meta["filename"]
    class_names = _unpickle_cifar(meta_path).get(dataset_cls.meta["key"])
    if not isinstance(class_names, list) or not class_names or not all(isinstance(n, str) for n in class_names):
        raise DataError(
            f"{meta_path} has no list of class names under '{dataset_cls.meta['key']}'; replace it with the file from the official archive."
        )
    batches = [_cifar_batch(folder / file, len(class_names)) for file in _cifar_batches(dataset_cls, train)]
    data = np.concatenate([images for images, _ in batches]).reshape(-1, 3, CIFAR_SIZE, CIFAR_SIZE)
    labels = np.concatenate([labels for _, labels in batches])
    return to_imageset(data, labels, class_names)


def _cifar_batch(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``data`` [N, 3072] and labels of one batch file, checked."""
    entry = _unpickle_cifar(path)
    data = entry.get("data")
    labels = entry.get("labels", entry.get("fine_labels"))
    pixels = 3 * CIFAR_SIZE * CIFAR_SIZE
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != pixels:
        raise DataError(
            f"{path} has no uint8 'data' array of {pixels} values per image; replace it with the file from the official archive."
        )
    label_array = np.asarray(labels if labels is not None else [], dtype=np.int64)
    if label_array.shape != (len(data),) or (len(data) and (label_array.min() < 0 or label_array.max() >= num_classes)):
        raise DataError(
            f"{path} does not hold one label in [0, {num_classes}) per image; replace it with the file from the official archive."
        )
    return data, label_array

