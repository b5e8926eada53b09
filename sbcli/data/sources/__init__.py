"""Data sources: every supported on-disk format, decoded to an :class:`ImageSet`.

Contract: each loader returns uint8 RGB images [N, 3, S, S], int64 labels and the class names in
label order, or raises :class:`DataError` with one sentence naming the problem and the fix. No
loader writes into the data it reads; the only thing written is the decode cache.

One module per source, plus what they share:

* :mod:`.folder` — :func:`load_folder`: class-per-folder images (ImageFolder layout), any common format.
* :mod:`.cifar` — :func:`load_cifar`: CIFAR-10/100 in torchvision's on-disk format (``cifar-*-python``).
* :mod:`.tiny_imagenet` — :func:`load_tiny_imagenet`: the official Tiny-ImageNet layout, as a folder
  or as the .zip.
* :mod:`.demo` — :func:`load_demo`: the embedded Fashion-MNIST subset (see ``sbcli/data/demo/README.md``).
* :mod:`.decode` — decoding one image and many on a thread pool, file listing (shared).
* :mod:`.cache` — :class:`DecodeCache`, decoded data sets on disk.
"""

from sbcli.data.sources.decode_cache import DecodeCache
from sbcli.data.sources.cifar import CIFAR_SIZE, load_cifar
from sbcli.data.sources.decode import IMAGE_EXTENSIONS, decode_image, decode_many
from sbcli.data.sources.demo import load_demo
from sbcli.data.sources.folder import FolderReport, load_folder
from sbcli.data.sources.tiny_imagenet import TINY_IMAGENET_SIZE, load_tiny_imagenet

__all__ = [
    "CIFAR_SIZE",
    "IMAGE_EXTENSIONS",
    "TINY_IMAGENET_SIZE",
    "DecodeCache",
    "FolderReport",
    "decode_image",
    "decode_many",
    "load_cifar",
    "load_demo",
    "load_folder",
    "load_tiny_imagenet",
]
