"""``--pretrained``: start a new learner's backbone from safetensors weights (the head is always new).

Where the weights come from: a Hub repository ``OWNER/NAME[@REVISION]`` (its ``model.safetensors``,
fetched with huggingface_hub into its cache: ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and the cache are
honoured as by ``sb pull``) or a local ``.safetensors`` file. What they may be: timm's or
torchvision's ResNet names (``conv1``, ``bn1``, ``layerN.i.*``, ``layerN.i.downsample.0/1``, ``fc``)
or an sbcli learner's own (``stages.*``, ``head.*``). Every backbone tensor of ``--arch`` at
``--width`` must be there with its shape; ``fc``/``head`` rows are dropped.

An sbcli learner directory gives its current network's backbone, with its architecture, width and
normalisation (:func:`learner_backbone`): a backbone sbcli trained on other classes.

Refused, with nothing trained: a pickle checkpoint (``torch.save``, ``pytorch_model.bin``: loading
one can run code), a file that is not safetensors, a backbone of another architecture, weights
whose SHA-256 differs from ``--pretrained-sha256``. What was loaded (repository, revision, commit,
file, SHA-256; a local file or learner by its name and SHA-256, never its path on this machine) is
recorded in learner.json under ``provenance.pretrained``, with ``input_size``, the square resolution the
weights were trained at, where it is known (:func:`weights_input_size`): a new learner's images are
resized to it unless ``--image-size`` says otherwise. A Hub backbone that was fetched once is used
from the cache when the Hub does not answer.

``random`` (:data:`RANDOM`) says on purpose that a frozen-backbone method keeps random weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sbcli.errors import ConfigError
from sbcli.hub.weight_packages import MEAN, STD, WeightPackage, converted, is_package, package
from sbcli.learner.records import PretrainedRecord
from sbcli.nets import create_model

SAFETENSORS = "model.safetensors"
RANDOM = "random"  # --pretrained random: no weights, asked for explicitly
LEARNER_STATE = "learner.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
HEAD_PREFIXES = ("fc.", "head.", "extra.")
_LAYER = re.compile(r"^layer(\d+)\.(\d+)\.(.*)$")
_DOWNSAMPLE = {"downsample.0.": "shortcut.", "downsample.1.": "shortcut_bn."}
IMAGENET_SIZE = 224  # the side torchvision's and timm's ImageNet ResNets are trained at
IMAGENET_STEM = "-in"  # sbcli's ImageNet-style ResNets (resnet18-in, resnet34-in), the architectures of those weights


@dataclass(frozen=True)
class PretrainedWeights:
    """Backbone tensors under sbcli's names, checked against an architecture, and where they came from."""

    tensors: dict[str, torch.Tensor]
    record: dict[str, Any]
    normalization: dict | None = None  # an sbcli learner's own (None: the ImageNet statistics pretrained weights expect)
    from_cache: bool = False  # read from the local Hub cache because the Hub did not answer (or offline)

    @property
    def info(self) -> PretrainedRecord:
        """``record`` typed: what the learner's provenance will hold of these weights."""
        return PretrainedRecord.from_json(self.record)


def map_timm_keys(name: str) -> str | None:
    """sbcli's name of a timm/torchvision ResNet tensor (``layer4.0.downsample.1.weight`` ->
    ``stages.3.0.shortcut_bn.weight``); sbcli names pass unchanged; None for the classifier."""
    if name.startswith(HEAD_PREFIXES):
        return None
    match = _LAYER.match(name)
    if match is None:
        return name
    stage, block, rest = match.groups()
    for theirs, ours in _DOWNSAMPLE.items():
        if rest.startswith(theirs):
            rest = ours + rest[len(theirs):]
    return f"stages.{int(stage) - 1}.{block}.{rest}"


def load(ref: str, arch: str, width: float, *, sha256: str | None = None, hub_cfg: Any = None) -> PretrainedWeights:
    """Fetch (or find) the weights ``ref`` names, check them, and map them onto ``arch`` at ``width``.

    Raises:
        ConfigError: a pickle checkpoint, not safetensors, another architecture, a wrong hash.
        ExportError: the Hub cannot give the file (unknown repository/revision, offline and not cached).
    """
    if is_learner(ref):
        return _from_learner(Path(ref).expanduser(), arch, width, sha256)
    if is_package(ref):
        return _from_package(package(ref), arch, sha256)
    path, record = _local(ref) if _looks_local(ref) else _from_hub(ref, hub_cfg)
    from sbcli.hub.zoo import sha256_file

    digest = sha256_file(path)
    if sha256 is not None and digest != sha256.lower():
        if record.get("cached"):
            from sbcli.hub.client import evict_cached

            evict_cached(path.parent, [SAFETENSORS])
        raise ConfigError(f"{_origin(record)} has SHA-256 {digest}, not the {sha256} that --pretrained-sha256 asks "
                          "for (corrupted, tampered with or another revision); nothing was trained.")
    from_cache = bool(record.get("from_cache"))
    record = {k: v for k, v in record.items() if k not in ("cached", "from_cache")} | {"sha256": digest, "arch": arch}
    tensors = _read_safetensors(path, _origin(record))
    matched = _match(tensors, arch, width, _origin(record))
    size = weights_input_size(record, arch, imagenet_names=any(_LAYER.match(k) for k in tensors))
    return PretrainedWeights(matched, record if size is None else record | {"input_size": size}, from_cache=from_cache)


def _from_package(pkg: WeightPackage, arch: str, sha256: str | None) -> PretrainedWeights:
    """A weight package's backbone (:mod:`sbcli.hub.weight_packages`), checked and converted once, on its timm
    architecture; its normalisation and input size are the release's own."""
    if arch != pkg.arch:
        raise ConfigError(f"--pretrained {pkg.name} holds the weights of {pkg.arch}, not of --arch {arch}; drop --arch "
                          "(it comes with the weights).")
    path, record = converted(pkg, sha256)
    tensors = _read_safetensors(path, pkg.name)
    from sbcli.nets.timm_backbone import match_weights

    return PretrainedWeights(match_weights(tensors, arch, pkg.name), record | {"arch": arch},
                             {"mean": list(MEAN), "std": list(STD)})


def weights_input_size(record: dict[str, Any], arch: str, *, imagenet_names: bool) -> int | None:
    """The square resolution weights were trained at, where it is known, else None.

    A timm Hub repository (``timm/NAME``, e.g. ``timm/resnet18.a1_in1k``): the training ``input_size`` of timm's
    pretrained configuration of NAME (known to timm offline), as for ``--arch timm/NAME``; weights in timm's or
    torchvision's ResNet layout (``layerN.i.*``: ImageNet weights) on an ImageNet-style ResNet: 224. An sbcli
    backbone's own weights (``stages.*``) may have been trained at any size: their learner directory says which.
    """
    from sbcli.nets.timm_backbone import PREFIX, is_timm_arch, known_input_size

    repo = str(record.get("repo") or "") if record.get("source") == "hub" else ""
    for name in (repo, arch):  # the weights' own tag first: timm/NAME is both a Hub repository and an --arch
        size = known_input_size(name) if name.startswith(PREFIX) else None
        if size is not None:
            return size
    if imagenet_names and not is_timm_arch(arch) and arch.endswith(IMAGENET_STEM):
        return IMAGENET_SIZE
    return None


def apply(model: torch.nn.Module, weights: PretrainedWeights) -> None:
    """Copy the backbone tensors into ``model`` (already checked to match it; the head is left as is)."""
    missing, unexpected = model.load_state_dict(weights.tensors, strict=False)
    left = [k for k in missing if not k.startswith("head.") and not k.endswith("num_batches_tracked")]
    if left or unexpected:  # load() checked this against the same architecture
        raise ConfigError(f"The pretrained weights do not fit the model ({(left + unexpected)[0]}); report this.")


def is_learner(ref: str) -> bool:
    """``ref`` is an sbcli learner directory (it holds learner.json)."""
    return (Path(ref).expanduser() / LEARNER_STATE).is_file()


def learner_backbone(ref: str) -> dict[str, Any]:
    """The architecture, width and training resolution of the learner directory ``ref`` (from its learner.json)."""
    from sbcli.learner.state import read_state

    state = read_state(Path(ref).expanduser())
    return {"arch": state.arch, "width": state.width, "image_size": state.image_size}


def _from_learner(path: Path, arch: str, width: float, sha256: str | None) -> PretrainedWeights:
    """The current network of an sbcli learner (every file checked as at any load), its head dropped."""
    from sbcli.learner.state import Learner, open_stored

    learner = Learner.load(path, "cpu")
    state = learner.state
    if (state.arch, state.width) != (arch, width):
        raise ConfigError(f"--pretrained {path.name} is a {state.arch} at width {state.width:g}, not --arch {arch} at "
                          f"--width {width:g}; drop --arch and --width (they come with the learner).")
    stored = open_stored(path)
    digest = stored.hashes.get(stored.files["model"], {}).get("sha256")
    if sha256 is not None and digest != sha256.lower():
        raise ConfigError(f"--pretrained {path.name} has model SHA-256 {digest}, not the {sha256} that "
                          "--pretrained-sha256 asks for; nothing was trained.")
    tensors = {k: v for k, v in learner.model.state_dict().items() if not k.startswith(HEAD_PREFIXES)}
    record = {"source": "learner", "name": path.name, "sha256": digest, "arch": arch, "width": width,
              "classes": state.num_classes, "steps": state.steps}
    return PretrainedWeights(_match(tensors, arch, width, path.name), record, dict(state.normalization))


def _looks_local(ref: str) -> bool:
    return ref.endswith((".safetensors", *PICKLE_SUFFIXES)) or Path(ref).exists()


def _origin(record: dict[str, Any]) -> str:
    if record["source"] in ("file", "learner"):
        return str(record["name"])
    return f"{record['repo']}@{record['revision']} ({record['file']})"


def _local(ref: str) -> tuple[Path, dict[str, Any]]:
    path = Path(ref).expanduser()
    if path.suffix in PICKLE_SUFFIXES:
        raise ConfigError(f"{ref} is a pickle checkpoint, which can run code when loaded; sbcli reads safetensors "
                          "only: convert it (safetensors.torch.save_file) or use a model.safetensors.")
    if not path.is_file():
        raise ConfigError(f"--pretrained {ref} is not a file; give a .safetensors file or a Hub repo OWNER/NAME[@REVISION].")
    return path, {"source": "file", "name": path.name}  # never the path: a pushed learner would publish it


def _from_hub(ref: str, hub_cfg: Any) -> tuple[Path, dict[str, Any]]:
    from sbcli.hub.client import HubConfig, check_repo_id, check_revision, client, fetch, is_offline, repo_info

    repo, at, revision = ref.partition("@")
    if not repo or (at and not revision):
        raise ConfigError(f"--pretrained {ref} is not OWNER/NAME[@REVISION] or a .safetensors file; "
                          "e.g. timm/resnet18.a1_in1k.")
    check_repo_id(repo)
    cfg = hub_cfg or HubConfig()
    revision = check_revision(revision or "main", " of --pretrained")
    info = None
    if not is_offline(cfg):  # look before downloading: a repository with only a pickle is refused here
        info, _unreachable = repo_info(client(cfg), repo, revision, cfg)  # None: no answer, the cache may have it
    if info is not None:
        names = [s.rfilename for s in info.siblings or []]
        if SAFETENSORS not in names:
            pickles = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
            if pickles:
                raise ConfigError(f"{repo}@{revision} has only a pickle checkpoint ({pickles[0]}), which can run code "
                                  f"when loaded; sbcli reads {SAFETENSORS} only: pick a repository or revision that has one.")
            raise ConfigError(f"{repo}@{revision} has no {SAFETENSORS}; pick a repository or revision that has one.")
    fill = f"fetch it once while online (`hf download {repo} {SAFETENSORS} --revision {revision}`, or this command)"
    snap = fetch(repo, revision, cfg, [SAFETENSORS], fill=fill)
    record = {"source": "hub", "repo": repo, "revision": revision, "commit": snap.commit, "file": SAFETENSORS,
              "cached": True, "from_cache": snap.from_cache}
    return snap.folder / SAFETENSORS, record


def _read_safetensors(path: Path, origin: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    with path.open("rb") as f:
        head = f.read(9)  # safetensors: an 8-byte header length, then the JSON header's "{"
    if head[8:9] != b"{" and head.startswith((b"PK", b"\x80")):  # torch.save's zip or a bare pickle
        raise ConfigError(f"{origin} is a pickle checkpoint (torch.save), which can run code when loaded; sbcli reads "
                          "safetensors only: convert it (safetensors.torch.save_file) or use a model.safetensors.")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise ConfigError(f"{origin} is not a safetensors file ({err}); give weights saved with safetensors.") from err


def _match(tensors: dict[str, torch.Tensor], arch: str, width: float, origin: str) -> dict[str, torch.Tensor]:
    """The tensors under sbcli's names, after checking that they are exactly ``arch``'s backbone."""
    from sbcli.nets.timm_backbone import is_timm_arch, match_weights

    if is_timm_arch(arch):  # --arch timm/NAME: timm's own names under the backbone's ``body``
        return match_weights(tensors, arch, origin)
    ours = {k: v for k, v in create_model(arch, 1, width).state_dict().items() if not k.startswith("head.")}
    mapped = {new: t for k, t in tensors.items() if (new := map_timm_keys(k)) is not None}
    hint = ("pick the --arch these weights were trained as (timm's resnet18/resnet34 are resnet18-in/resnet34-in at "
            "--width 1) or drop --pretrained")
    unknown = sorted(set(mapped) - set(ours))
    missing = sorted(k for k in set(ours) - set(mapped) if not k.endswith("num_batches_tracked"))
    if unknown or missing:
        what = f"it has {unknown[0]}" if unknown else f"it lacks {missing[0]}"
        raise ConfigError(f"{origin} does not match --arch {arch} at --width {width:g} ({what}); {hint}.")
    for key, tensor in mapped.items():
        if tuple(tensor.shape) != tuple(ours[key].shape):
            raise ConfigError(f"{origin} does not match --arch {arch} at --width {width:g} ({key} is "
                              f"{tuple(tensor.shape)}, not {tuple(ours[key].shape)}); {hint}.")
    return {k: t.to(ours[k].dtype) for k, t in mapped.items()}
