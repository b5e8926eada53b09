"""Build the embedded demo data set, ``sbcli/data/demo/fashion_mnist_demo.npz``.

The demo is a class-balanced, seeded subset of Fashion-MNIST (MIT licence, Zalando SE): 300
training and 100 test images for each of the 10 classes, uint8 28x28 grayscale, as stored in
the official IDX files. The IDX files come from the Debian package ``dataset-fashion-mnist``
(``apt-get install dataset-fashion-mnist``), which puts them under
``/usr/share/datasets/fashion-mnist/``.

Usage::

    python scripts/make_demo_data.py [--source DIR] [--out FILE] [--seed N]

The output holds the keys ``train_images`` [3000, 28, 28], ``train_labels`` [3000],
``test_images`` [1000, 28, 28], ``test_labels`` [1000] and ``class_names`` (a fixed-width
unicode array), so that it loads with ``np.load(..., allow_pickle=False)``.
"""

from __future__ import annotations

import argparse
import gzip
import struct
import sys
from pathlib import Path

import numpy as np

# Fashion-MNIST's classes in label order, spelled so they can name folders and files.
CLASS_NAMES = (
    "tshirt_top",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle_boot",
)
IDX_IMAGES_MAGIC = 2051
IDX_LABELS_MAGIC = 2049
DEFAULT_SOURCE = Path("/usr/share/datasets/fashion-mnist")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "sbcli" / "data" / "demo" / "fashion_mnist_demo.npz"


def read_idx_images(path: Path) -> np.ndarray:
    """Read a gzipped IDX image file.

    Args:
        path: an ``*-images-idx3-ubyte.gz`` file.

    Returns:
        uint8 array [N, rows, cols].

    Raises:
        ValueError: the file is not an IDX image file.
    """
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, count, rows, cols = struct.unpack(">IIII", raw[:16])
    if magic != IDX_IMAGES_MAGIC or len(raw) != 16 + count * rows * cols:
        raise ValueError(f"{path} is not an IDX image file")
    return np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(count, rows, cols)


def read_idx_labels(path: Path) -> np.ndarray:
    """Read a gzipped IDX label file.

    Args:
        path: an ``*-labels-idx1-ubyte.gz`` file.

    Returns:
        uint8 array [N].

    Raises:
        ValueError: the file is not an IDX label file.
    """
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, count = struct.unpack(">II", raw[:8])
    if magic != IDX_LABELS_MAGIC or len(raw) != 8 + count:
        raise ValueError(f"{path} is not an IDX label file")
    return np.frombuffer(raw, dtype=np.uint8, offset=8)


def balanced_indices(labels: np.ndarray, per_class: int, rng: np.random.Generator) -> np.ndarray:
    """Pick ``per_class`` indices of every class at random, returned in file order.

    Args:
        labels: the label of each image.
        per_class: how many images to keep of each class.
        rng: the seeded generator that picks them.

    Returns:
        sorted int64 indices, ``per_class`` times the number of classes.
    """
    picks = [rng.choice(np.flatnonzero(labels == c), size=per_class, replace=False) for c in range(len(CLASS_NAMES))]
    return np.sort(np.concatenate(picks))


def build_split(source: Path, prefix: str, per_class: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Read one official split and keep a class-balanced subset of it.

    Args:
        source: the folder holding the four IDX ``.gz`` files.
        prefix: ``"train"`` or ``"t10k"``, the official file prefix of the split.
        per_class: images kept per class.
        rng: the seeded generator that picks them.

    Returns:
        images uint8 [per_class * 10, 28, 28] and labels uint8 [per_class * 10].
    """
    images = read_idx_images(source / f"{prefix}-images-idx3-ubyte.gz")
    labels = read_idx_labels(source / f"{prefix}-labels-idx1-ubyte.gz")
    keep = balanced_indices(labels, per_class, rng)
    return images[keep], labels[keep]


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, build the subset and write it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source", type=Path, default=DEFAULT_SOURCE, help="folder with the Fashion-MNIST IDX .gz files"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the .npz to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the subset")
    parser.add_argument("--train-per-class", type=int, default=300)
    parser.add_argument("--test-per-class", type=int, default=100)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    train_images, train_labels = build_split(args.source, "train", args.train_per_class, rng)
    test_images, test_labels = build_split(args.source, "t10k", args.test_per_class, rng)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        args.out,
        train_images=train_images,
        train_labels=train_labels,
        test_images=test_images,
        test_labels=test_labels,
        class_names=np.array(CLASS_NAMES, dtype=np.str_),
    )
    sys.stderr.write(f"wrote {args.out} ({args.out.stat().st_size} bytes)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
