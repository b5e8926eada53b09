"""Data sources: every supported on-disk format, decoded to an :class:`ImageSet`.

Contract: each loader returns uint8 RGB images [N, 3, S, S], int64 labels and the class names in
label order, or raises :class:`DataError` with one sentence naming the problem and the fix. No
loader writes into the data it reads; the only thing written is the decode cache.

* :func:`load_folder`: class-per-folder images (ImageFolder layout), any common format.
* :func:`load_cifar`: CIFAR-10/100 in torchvision's on-disk format (``cifar-*-python``).
* :func:`load_tiny_imagenet`: the official Tiny-ImageNet layout, as a folder or as the .zip.
* :func:`load_demo`: the embedded Fashion-MNIST subset (see ``demo/README.md``).

Encoded images are decoded on a thread pool (Pillow releases the GIL while decoding and
resizing). Measured on a 2-core VM shared with another busy process: the 50,000 train JPEGs
(64x64) of the 100-class Tiny-ImageNet subset decode in about 10 s straight from the zip, and
CIFAR-10's 50,000 32x32 JPEGs as class folders in about 9 s; a :class:`DecodeCache` hit loads
either in under a second.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import tempfile
import zipfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import safetensors
import safetensors.torch
import torch
from PIL import Image, ImageOps

from sbcli.data import walk
from sbcli.data.imageset import ImageSet
from sbcli.errors import ConfigError, DataError, UnknownNameError

if TYPE_CHECKING:
    from torchvision.datasets import CIFAR10

logger = logging.getLogger(__name__)

#: File name endings (lower case) that :func:`load_folder` treats as images; others are skipped.
IMAGE_EXTENSIONS = frozenset(
    ".jpg .jpeg .jpe .jfif .png .bmp .dib .gif .webp .tif .tiff .ppm .pgm .pbm .pnm .tga .ico".split()
)
TINY_IMAGENET_SIZE = 64
CIFAR_SIZE = 32
_CACHE_FORMAT = 1  # bump when decoding changes, so that old cache entries stop matching
_DECODE_CHUNK = 256  # images per thread-pool task: large enough to amortise the task overhead
_DEMO_PACKAGE = "sbcli.data"
_DEMO_FILE = ("demo", "fashion_mnist_demo.npz")
_DEMO_PAD = 2  # 28 px + 2 * 2 px of zeros = 32 px, the CIFAR resolution the nets expect


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------


def decode_image(data: bytes, image_size: int) -> np.ndarray:
    """Decode one encoded image to RGB at ``image_size`` x ``image_size``.

    EXIF rotation is applied (phone photos store it there), alpha is dropped as torchvision's
    ``pil_loader`` does, and the image is resized with Pillow's antialiased bilinear filter,
    without keeping its aspect ratio.

    Args:
        data: the bytes of a file in any format Pillow reads.
        image_size: the side of the square output.

    Returns:
        uint8 array [3, image_size, image_size].

    Raises:
        OSError, SyntaxError, ValueError, Image.DecompressionBombError: Pillow cannot decode it.
    """
    with Image.open(io.BytesIO(data)) as image:
        # JPEG can decode at 1/2, 1/4 or 1/8 scale: a big photo then costs a fraction to decode.
        image.draft(None, (image_size, image_size))
        rgb = _to_rgb(ImageOps.exif_transpose(image))
    if rgb.size != (image_size, image_size):
        rgb = rgb.resize((image_size, image_size), Image.Resampling.BILINEAR)
    return np.asarray(rgb).transpose(2, 0, 1)


def _to_rgb(image: Image.Image) -> Image.Image:
    """Convert any Pillow mode to 8-bit RGB."""
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        # 16-bit (and 32-bit) grayscale: Pillow's convert would clip at 255 instead of scaling.
        scale = 1.0 if image.mode == "F" else 257.0
        gray = np.clip(np.asarray(image, dtype=np.float64) / scale, 0, 255).astype(np.uint8)
        return Image.fromarray(gray, mode="L").convert("RGB")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # Pillow warns when palette transparency goes straight to RGB
    return image.convert("RGB")


def _decode_one(key: str, read: Callable[[str], bytes], describe: Callable[[str], str], image_size: int) -> np.ndarray:
    """Read and decode one image, turning every failure into a :class:`DataError`."""
    try:
        data = read(key)
    except (OSError, zipfile.BadZipFile) as err:
        raise DataError(f"Cannot read {describe(key)} ({err}); check that the file is readable.") from err
    try:
        return decode_image(data, image_size)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise DataError(f"Cannot decode image {describe(key)} ({err}); remove or replace the file.") from err


def _decode_chunk(
    keys: Sequence[str],
    indices: range,
    read: Callable[[str], bytes],
    describe: Callable[[str], str],
    out: np.ndarray,
) -> None:
    """Decode ``keys[indices]`` into the matching rows of ``out`` (one thread-pool task)."""
    for i in indices:
        out[i] = _decode_one(keys[i], read, describe, out.shape[-1])


def decode_many(
    keys: Sequence[str], read: Callable[[str], bytes], describe: Callable[[str], str], image_size: int
) -> np.ndarray:
    """Decode many images on a thread pool.

    Args:
        keys: what identifies each image to ``read`` (a path, a zip member name).
        read: returns the encoded bytes of one key; called from worker threads.
        describe: names a key for error messages (e.g. its full path).
        image_size: the side of the square output.

    Returns:
        uint8 array [len(keys), 3, image_size, image_size], in the order of ``keys``.

    Raises:
        DataError: an image cannot be read or decoded; the message names it.
    """
    out = np.empty((len(keys), 3, image_size, image_size), dtype=np.uint8)
    chunks = [range(i, min(i + _DECODE_CHUNK, len(keys))) for i in range(0, len(keys), _DECODE_CHUNK)]
    with ThreadPoolExecutor(max_workers=_worker_count()) as pool:
        futures = [pool.submit(_decode_chunk, keys, chunk, read, describe, out) for chunk in chunks]
        try:
            for future in futures:
                future.result()
        finally:
            for future in futures:  # after a failure, drop the work not yet started
                future.cancel()
    return out


def _worker_count() -> int:
    """Threads for decoding: the CPUs this process may use (decoding is CPU-bound)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, min(16, len(os.sched_getaffinity(0))))
    return max(1, min(16, os.cpu_count() or 1))


def _to_imageset(images: np.ndarray, labels: Sequence[int] | np.ndarray, class_names: Sequence[str]) -> ImageSet:
    """Wrap decoded arrays as an :class:`ImageSet`."""
    label_tensor = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    return ImageSet(torch.from_numpy(np.ascontiguousarray(images)), label_tensor, list(class_names))


# --------------------------------------------------------------------------------------------
# Decode cache
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeCache:
    """Decoded data sets on disk, so that a second run does not decode again.

    An entry is ``<key>.safetensors`` (``images`` uint8, ``labels`` int64) plus ``<key>.json``
    (class names and what the loader reports besides), each written to a temporary file and
    moved into place with ``os.replace``. The key (:meth:`key`) covers the source kind, the
    resolved path, the image size and a fingerprint of the source files (names, sizes, mtimes),
    so an edited source misses the cache. An unreadable or inconsistent entry is a miss: it is
    decoded again and overwritten.

    Attributes:
        directory: where the entries live.
    """

    directory: Path

    @classmethod
    def default(cls) -> DecodeCache:
        """The cache at ``$SBCLI_CACHE``, else ``$XDG_CACHE_HOME/sbcli/decoded``, else ``~/.cache/sbcli/decoded``."""
        if os.environ.get("SBCLI_CACHE"):
            return cls(Path(os.environ["SBCLI_CACHE"]).expanduser())
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
        return cls(base / "sbcli" / "decoded")

    @staticmethod
    def key(kind: str, path: Path, image_size: int, fingerprint: str) -> str:
        """The hex sha256 naming an entry.

        Args:
            kind: the source and split, e.g. ``"folder"`` or ``"tiny-imagenet:val"``.
            path: the source path (resolved here).
            image_size: the decoded resolution.
            fingerprint: a digest of the source files' names, sizes and mtimes.
        """
        parts = [_CACHE_FORMAT, kind, str(Path(path).resolve()), int(image_size), fingerprint]
        return hashlib.sha256(json.dumps(parts).encode("utf-8")).hexdigest()

    def get(self, key: str) -> tuple[ImageSet, dict[str, Any]] | None:
        """The entry under ``key`` and its extra metadata, or None when absent or unusable."""
        tensor_path, meta_path = self._paths(key)
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            tensors = safetensors.torch.load_file(tensor_path)
        # A missing, truncated or garbled entry is a miss (json/unicode errors are ValueErrors).
        except (OSError, ValueError, safetensors.SafetensorError):
            return None
        return _entry_from(meta, tensors)

    def put(self, key: str, data: ImageSet, extra: dict[str, Any] | None = None) -> None:
        """Store ``data`` (and JSON-able ``extra``) under ``key``; failure to write only logs a warning."""
        tensor_path, meta_path = self._paths(key)
        meta = {
            "format": _CACHE_FORMAT,
            "class_names": list(data.class_names),
            "count": len(data),
            "extra": extra or {},
        }
        tensors = {"images": data.images.contiguous(), "labels": data.labels.contiguous()}
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            _atomic_write(tensor_path, lambda tmp: safetensors.torch.save_file(tensors, tmp))
            _atomic_write(meta_path, lambda tmp: tmp.write_text(json.dumps(meta), encoding="utf-8"))
        except OSError as err:
            # The cache only saves time: a read-only or full disk must not fail the load.
            logger.warning(
                "Could not write the decode cache in %s (%s); the data will be decoded again next time.",
                self.directory,
                err,
            )

    def _paths(self, key: str) -> tuple[Path, Path]:
        """The tensor file and the metadata file of ``key``."""
        return self.directory / f"{key}.safetensors", self.directory / f"{key}.json"


def _atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write`` on a temporary file beside ``path``, then move it into place."""
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _entry_from(meta: object, tensors: dict[str, torch.Tensor]) -> tuple[ImageSet, dict[str, Any]] | None:
    """Rebuild a cache entry, or None when its two files do not fit together."""
    if not isinstance(meta, dict) or meta.get("format") != _CACHE_FORMAT:
        return None
    names, extra = meta.get("class_names"), meta.get("extra")
    images, labels = tensors.get("images"), tensors.get("labels")
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names) and isinstance(extra, dict)):
        return None
    if images is None or labels is None or images.dtype != torch.uint8 or labels.dtype != torch.int64:
        return None
    if (
        images.ndim != 4
        or images.shape[1] != 3
        or labels.shape != (images.shape[0],)
        or meta.get("count") != len(labels)
    ):
        return None
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= len(names)):
        return None
    return ImageSet(images, labels, names), extra


def _fingerprint(lines: Sequence[str]) -> str:
    """A digest of a file listing (one ``name\\tsize\\tmtime_ns`` line per file)."""
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


def _stat_line(name: str, path: Path) -> str:
    """The fingerprint line of one file."""
    st = walk.stat(path)
    return f"{name}\t{st.st_size}\t{st.st_mtime_ns}"


# --------------------------------------------------------------------------------------------
# Class-per-folder images
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FolderReport:
    """What :func:`load_folder` read.

    Attributes:
        data: the decoded images, labels and class names (sorted folder names).
        skipped: how many files were skipped because they are not images by their extension
            (hidden files such as ``.DS_Store`` and files beside the class folders included).
        skipped_examples: up to five of those, relative to the root, to show the user.
    """

    data: ImageSet
    skipped: int
    skipped_examples: tuple[str, ...] = ()


@dataclass(frozen=True)
class _FolderListing:
    """The files of a class-per-folder tree, before decoding."""

    class_names: list[str]
    files: list[Path]
    labels: list[int]
    skipped: list[str]
    fingerprint: str


def load_folder(root: Path, image_size: int, *, cache: DecodeCache | None) -> FolderReport:
    """Load class-per-folder images: ``root/<class>/**/<image>``.

    Class names are the sorted names of the subfolders (hidden ones ignored); images may sit
    in nested folders below their class folder. Every image is converted to RGB and resized.

    Args:
        root: the folder holding one subfolder per class.
        image_size: the side of the square images returned.
        cache: where decoded data is kept between runs, or None to always decode.

    Returns:
        The images and the count of files skipped as not images.

    Raises:
        DataError: the folder is missing, has no class folders, a class folder has no images,
            or an image cannot be decoded (the message names the file).
        ConfigError: ``image_size`` is not positive.
    """
    if image_size < 1:
        raise ConfigError(f"Image size must be at least 1 pixel, got {image_size}; pass a positive image size.")
    root = Path(root).expanduser()
    listing = _scan_folder(root)
    key = DecodeCache.key("folder", root, image_size, listing.fingerprint)
    hit = cache.get(key) if cache is not None else None
    if hit is not None:
        data, extra = hit
        return FolderReport(data, int(extra.get("skipped", 0)), tuple(extra.get("skipped_examples", ())))
    keys = [str(path) for path in listing.files]
    images = decode_many(keys, _read_path, str, image_size)
    report = FolderReport(
        _to_imageset(images, listing.labels, listing.class_names), len(listing.skipped), tuple(listing.skipped[:5])
    )
    if cache is not None:
        cache.put(key, report.data, {"skipped": report.skipped, "skipped_examples": list(report.skipped_examples)})
    return report


def _read_path(key: str) -> bytes:
    """The bytes of a file named by its path."""
    return Path(key).read_bytes()


def _scan_folder(root: Path) -> _FolderListing:
    """List the class folders and their images, checking the layout."""
    if not root.exists():
        raise DataError(f"Image folder {root} does not exist; check the path.")
    if not root.is_dir():
        raise DataError(f"{root} is a file, not a folder; pass a folder with one subfolder of images per class.")
    entries = sorted(root.iterdir(), key=lambda p: p.name)
    class_dirs = [p for p in entries if p.is_dir() and not p.name.startswith(".")]
    if not class_dirs:
        raise DataError(
            f"No class folders in {root}; put the images of each class in their own subfolder, e.g. {root / 'cat' / '001.jpg'}."
        )
    skipped = [p.name for p in entries if not p.is_dir()]
    stat_lines = [_stat_line(name, root / name) for name in skipped]
    files: list[Path] = []
    labels: list[int] = []
    for label, class_dir in enumerate(class_dirs):
        images = _scan_class(root, class_dir, skipped, stat_lines)
        if not images:
            raise DataError(f"No images found in {class_dir}; put at least one image file in each class folder.")
        files += images
        labels += [label] * len(images)
    return _FolderListing([p.name for p in class_dirs], files, labels, skipped, _fingerprint(stat_lines))


def _scan_class(root: Path, class_dir: Path, skipped: list[str], stat_lines: list[str]) -> list[Path]:
    """The image files below one class folder, sorted; other files are appended to ``skipped``."""
    images: list[Path] = []
    for path in _walk_files(class_dir):
        name = path.relative_to(root).as_posix()
        stat_lines.append(_stat_line(name, path))
        if path.suffix.lower() in IMAGE_EXTENSIONS and not path.name.startswith("."):
            images.append(path)
        else:
            skipped.append(name)  # hidden files too: macOS "._x.jpg" files are not images
    return images


def _walk_files(folder: Path) -> Iterator[Path]:
    """Every file below ``folder`` in sorted order, following symlinks as ImageFolder does (loops refused)."""
    yield from walk.walk_files(folder)


# --------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100
# --------------------------------------------------------------------------------------------


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
    return _to_imageset(data, labels, class_names)


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


# --------------------------------------------------------------------------------------------
# Tiny-ImageNet
# --------------------------------------------------------------------------------------------


class _Tree(Protocol):
    """Read access to a Tiny-ImageNet tree, on disk or in a zip, by '/'-separated paths."""

    def read(self, rel: str) -> bytes:
        """The bytes of the file at ``rel``."""

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` is a file."""

    def files(self, rel_dir: str) -> list[str]:
        """The sorted paths of the files directly in ``rel_dir``."""

    def describe(self, rel: str) -> str:
        """``rel`` spelled for an error message."""

    def fingerprint(self) -> str:
        """A digest of the tree's files, sizes and mtimes."""


@dataclass(frozen=True)
class _DirTree:
    """A Tiny-ImageNet tree in a folder."""

    root: Path

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def exists(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def files(self, rel_dir: str) -> list[str]:
        folder = self.root / rel_dir
        if not folder.is_dir():
            return []
        return sorted(f"{rel_dir}/{p.name}" for p in folder.iterdir() if p.is_file())

    def describe(self, rel: str) -> str:
        return str(self.root / rel)

    def fingerprint(self) -> str:
        lines = [_stat_line(p.relative_to(self.root).as_posix(), p) for p in _walk_files(self.root)]
        return _fingerprint(lines)


class _ZipTree:
    """A Tiny-ImageNet tree inside a zip, below ``prefix`` (e.g. ``"tiny-imagenet-200/"``)."""

    def __init__(self, path: Path, archive: zipfile.ZipFile, prefix: str) -> None:
        self.path, self.archive, self.prefix = path, archive, prefix
        self._files: set[str] = set()
        self._children: dict[str, list[str]] = defaultdict(list)
        for member in archive.namelist():
            if member.startswith(prefix) and not member.endswith("/"):
                rel = member[len(prefix) :]
                self._files.add(rel)
                self._children[rel.rpartition("/")[0]].append(rel)

    def read(self, rel: str) -> bytes:
        return self.archive.read(self.prefix + rel)  # ZipFile serialises concurrent reads itself

    def exists(self, rel: str) -> bool:
        return rel in self._files

    def files(self, rel_dir: str) -> list[str]:
        return sorted(self._children.get(rel_dir, []))

    def describe(self, rel: str) -> str:
        return f"{self.prefix}{rel} in {self.path}"

    def fingerprint(self) -> str:
        return _fingerprint([_stat_line(self.prefix, self.path)])


def load_tiny_imagenet(path: Path, train: bool, *, cache: DecodeCache | None) -> ImageSet:
    """Load Tiny-ImageNet (or a subset of its classes) from the official layout.

    The layout is ``wnids.txt``, ``words.txt``, ``train/<wnid>/images/*.JPEG`` and
    ``val/images/*.JPEG`` with ``val/val_annotations.txt``; the val split is the test set.
    Labels follow the sorted wnids; a class is named by the first name ``words.txt`` gives its
    wnid (``"goldfish"``), with ``_<wnid>`` appended to names that two classes share.

    Args:
        path: the dataset folder, a folder holding exactly one such folder, or the official
            zip (read in place, without extracting it).
        train: the train split, else the val split.
        cache: where decoded data is kept between runs, or None to always decode.

    Returns:
        64x64 images.

    Raises:
        DataError: the path or a required file is missing, a file is malformed, or an image
            cannot be decoded.
    """
    path = Path(path).expanduser()
    kind = f"tiny-imagenet:{'train' if train else 'val'}"
    with _open_tiny_tree(path) as tree:
        if cache is None:
            return _decode_tiny(tree, train)
        key = DecodeCache.key(kind, path, TINY_IMAGENET_SIZE, tree.fingerprint())
        hit = cache.get(key)
        if hit is not None:
            return hit[0]
        data = _decode_tiny(tree, train)
    cache.put(key, data)
    return data


def _decode_tiny(tree: _Tree, train: bool) -> ImageSet:
    """Read the class list and decode one split of an opened tree."""
    wnids = _read_wnids(tree)
    class_names = _tiny_class_names(tree, wnids)
    keys, labels = _tiny_train_items(tree, wnids) if train else _tiny_val_items(tree, wnids)
    return _to_imageset(decode_many(keys, tree.read, tree.describe, TINY_IMAGENET_SIZE), labels, class_names)


@contextmanager
def _open_tiny_tree(path: Path) -> Iterator[_Tree]:
    """Open ``path`` as a Tiny-ImageNet tree (folder, parent folder, or zip)."""
    if not path.exists():
        raise DataError(f"Tiny-ImageNet not found at {path}; pass the dataset folder or its .zip.")
    if path.is_dir():
        yield _DirTree(_find_tiny_root(path))
        return
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise DataError(
            f"{path} is not a readable zip file ({err}); pass the Tiny-ImageNet folder or its official .zip."
        ) from err
    with archive:
        yield _ZipTree(path, archive, _find_zip_prefix(path, archive))


def _find_tiny_root(path: Path) -> Path:
    """``path`` if it holds ``wnids.txt``, else its one subfolder that does."""
    if (path / "wnids.txt").is_file():
        return path
    found = sorted(p for p in path.iterdir() if (p / "wnids.txt").is_file())
    if len(found) != 1:
        why = "no subfolder holds" if not found else f"{len(found)} subfolders hold"
        raise DataError(
            f"{path} is not a Tiny-ImageNet folder: it has no wnids.txt and {why} one; pass the folder that holds wnids.txt."
        )
    return found[0]


def _find_zip_prefix(path: Path, archive: zipfile.ZipFile) -> str:
    """The folder inside the zip that holds ``wnids.txt`` ("" for the zip's top)."""
    prefixes = [m[: -len("wnids.txt")] for m in archive.namelist() if m == "wnids.txt" or m.endswith("/wnids.txt")]
    if len(prefixes) != 1:
        raise DataError(f"{path} holds {len(prefixes)} wnids.txt files, not one; pass the official Tiny-ImageNet zip.")
    return prefixes[0]


def _read_text(tree: _Tree, rel: str) -> str:
    """A required text file of the tree."""
    if not tree.exists(rel):
        raise DataError(f"{tree.describe(rel)} is missing; pass a complete Tiny-ImageNet folder or zip.")
    return tree.read(rel).decode("utf-8")


def _read_wnids(tree: _Tree) -> list[str]:
    """The sorted class ids of ``wnids.txt``."""
    wnids = sorted({line.strip() for line in _read_text(tree, "wnids.txt").splitlines() if line.strip()})
    if not wnids:
        raise DataError(f"{tree.describe('wnids.txt')} lists no classes; put one wnid per line in it.")
    return wnids


def _tiny_class_names(tree: _Tree, wnids: list[str]) -> list[str]:
    """The first ``words.txt`` name of each wnid, made unique by appending the wnid."""
    words: dict[str, str] = {}
    for line in _read_text(tree, "words.txt").splitlines():
        wnid, _, names = line.partition("\t")
        words[wnid.strip()] = names.split(",")[0].strip()
    missing = [w for w in wnids if not words.get(w)]
    if missing:
        raise DataError(
            f"{tree.describe('words.txt')} has no name for {missing[0]}; use the words.txt of the official release."
        )
    counts = Counter(words[w] for w in wnids)
    return [words[w] if counts[words[w]] == 1 else f"{words[w]}_{w}" for w in wnids]


def _is_image_name(rel: str) -> bool:
    """Whether a tree path names an image file by its extension."""
    name = rel.rpartition("/")[2]
    return not name.startswith(".") and Path(name).suffix.lower() in IMAGE_EXTENSIONS


def _tiny_train_items(tree: _Tree, wnids: list[str]) -> tuple[list[str], list[int]]:
    """The training images and labels: ``train/<wnid>/images/*``."""
    keys: list[str] = []
    labels: list[int] = []
    for label, wnid in enumerate(wnids):
        images = [rel for rel in tree.files(f"train/{wnid}/images") if _is_image_name(rel)]
        if not images:
            raise DataError(
                f"No images found in {tree.describe(f'train/{wnid}/images')}; put the training images of {wnid} there."
            )
        keys += images
        labels += [label] * len(images)
    return keys, labels


def _tiny_val_items(tree: _Tree, wnids: list[str]) -> tuple[list[str], list[int]]:
    """The val images and labels, from ``val/val_annotations.txt``."""
    label_of = {wnid: i for i, wnid in enumerate(wnids)}
    where = tree.describe("val/val_annotations.txt")
    keys: list[str] = []
    labels: list[int] = []
    for number, line in enumerate(_read_text(tree, "val/val_annotations.txt").splitlines(), start=1):
        fields = line.split("\t")
        if not line.strip():
            continue
        if len(fields) < 2 or fields[1] not in label_of:
            raise DataError(
                f"Line {number} of {where} does not name an image and a class of wnids.txt; use the official annotation file."
            )
        rel = f"val/images/{fields[0]}"
        if not tree.exists(rel):
            raise DataError(f"{tree.describe(rel)}, listed in {where}, is missing; restore it or remove its line.")
        keys.append(rel)
        labels.append(label_of[fields[1]])
    if not keys:
        raise DataError(f"{where} lists no images; use the official annotation file.")
    return keys, labels


# --------------------------------------------------------------------------------------------
# The embedded demo
# --------------------------------------------------------------------------------------------


def load_demo(train: bool) -> ImageSet:
    """Load the embedded demo: a class-balanced Fashion-MNIST subset (300/100 per class).

    The 28x28 grayscale images are repeated to three channels and zero-padded to 32x32.

    Args:
        train: the training split (3,000 images), else the test split (1,000 images).

    Returns:
        32x32 images of 10 classes, named ``tshirt_top``, ``trouser``, ... ``ankle_boot``.

    Raises:
        DataError: the demo file is missing from the installed package.
    """
    split = "train" if train else "test"
    resource = resources.files(_DEMO_PACKAGE).joinpath(*_DEMO_FILE)
    try:
        with resource.open("rb") as f, np.load(f, allow_pickle=False) as npz:
            gray, labels = npz[f"{split}_images"], npz[f"{split}_labels"]
            class_names = [str(n) for n in npz["class_names"]]
    except FileNotFoundError as err:
        raise DataError(
            f"The embedded demo data {'/'.join(_DEMO_FILE)} is missing from the installed sbcli; reinstall sbcli."
        ) from err
    pad = _DEMO_PAD
    padded = np.pad(gray, ((0, 0), (pad, pad), (pad, pad)))
    return _to_imageset(np.repeat(padded[:, None], 3, axis=1), labels, class_names)
