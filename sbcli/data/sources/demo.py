"""The embedded demo: a class-balanced Fashion-MNIST subset (see ``sbcli/data/demo/README.md``)."""

from __future__ import annotations

from importlib import resources

import numpy as np

from sbcli.data.imageset import ImageSet
from sbcli.data.sources.decode import to_imageset
from sbcli.errors import DataError

_DEMO_PACKAGE = "sbcli.data"
_DEMO_FILE = ("demo", "fashion_mnist_demo.npz")
_DEMO_PAD = 2  # 28 px + 2 * 2 px of zeros = 32 px, the CIFAR resolution the nets expect


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
    return to_imageset(np.repeat(padded[:, None], 3, axis=1), labels, class_names)
