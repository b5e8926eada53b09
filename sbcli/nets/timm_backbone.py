"""Any timm architecture as a frozen backbone (``--arch timm/NAME``, the ``timm`` extra).

``timm/NAME`` builds ``timm.create_model(NAME, num_classes=0)`` (pooled features, no classifier)
under sbcli's growing head, so the task loop, the learner files, the export and the server treat it
as any sbcli network. NAME may carry timm's pretrained tag (``resnet18.a1_in1k``,
``vit_small_patch16_224.augreg_in21k_ft_in1k``); the weights come from the Hub repository timm
names for it (``pretrained_cfg["hf_hub_id"]``, e.g. ``timm/resnet18.a1_in1k``) through
:mod:`sbcli.hub.pretrained`, unless ``--pretrained`` names other safetensors weights. The input
resolution and the normalisation statistics are timm's pretrained configuration of NAME (known to
timm offline); the learner records both.

These backbones have no Split-and-Bridge partition: only frozen-backbone methods take them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sbcli.errors import ConfigError
from sbcli.nets.layers import GrowingHead, MaskedLinear

PREFIX = "timm/"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")  # timm's model names, with or without a pretrained tag


def is_timm_arch(arch: object) -> bool:
    """Whether ``--arch`` names a timm architecture (``timm/NAME``)."""
    return isinstance(arch, str) and arch.startswith(PREFIX)


def _timm() -> Any:
    try:
        import timm
    except ImportError:
        raise ConfigError("--arch timm/NAME needs timm: pip install 'sbcli[timm]'.") from None
    return timm


def _build(name: str) -> nn.Module:
    timm = _timm()
    try:
        return timm.create_model(name, pretrained=False, num_classes=0)
    except RuntimeError as err:  # timm's "Unknown model (...)"
        raise ConfigError(f"--arch {PREFIX}{name}: timm has no such architecture ({err}); "
                          "`python -c \"import timm; print(timm.list_models('resnet*'))\"` lists them.") from None


def build_full(name: str) -> nn.Module:
    """timm's ``name`` with its own classifier (1,000 ImageNet classes): the whole network a checkpoint holds."""
    timm = _timm()
    try:
        return timm.create_model(name, pretrained=False)
    except RuntimeError as err:
        raise ConfigError(f"timm has no architecture {name} ({err}); upgrade timm.") from None


class TimmBackbone(GrowingHead):
    """A timm network's pooled features under sbcli's growing head (the interface of IncrementalResNet)."""

    def __init__(self, arch: str, num_classes: int, width: float = 1.0) -> None:
        super().__init__()
        if width != 1.0:
            raise ConfigError(f"--width {width:g} does not apply to --arch {arch}: timm builds it at its own width; "
                              "drop --width.")
        self.arch = arch
        self.body = _build(arch[len(PREFIX):])
        self.num_features = int(self.body.num_features)
        self.head = MaskedLinear(self.num_features, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features [B, num_features] of normalised images [B, 3, H, W]."""
        return self.body(x)


@dataclass(frozen=True)
class TimmInput:
    """What a timm architecture's pretrained weights expect: a square resolution and the statistics."""

    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    weights: str  # the Hub repository of its weights (timm's hf_hub_id), or the arch itself


def input_config(arch: str) -> TimmInput:
    """Resolution, normalisation and weights repository of ``timm/NAME`` from timm's pretrained cfg."""
    with torch.device("meta"):
        cfg = dict(getattr(_build(arch[len(PREFIX):]), "pretrained_cfg", {}) or {})
    size = cfg.get("input_size") or (3, 224, 224)  # the resolution it was trained at (not its larger test size)
    mean, std = cfg.get("mean", (0.485, 0.456, 0.406)), cfg.get("std", (0.229, 0.224, 0.225))
    hub = cfg.get("hf_hub_id") or arch
    return TimmInput(int(size[-1]), tuple(float(m) for m in mean), tuple(float(s) for s in std), hub)


def known_input_size(name: str) -> int | None:
    """The training resolution of ``timm/NAME`` (:func:`input_config`), or None when timm is not installed or has
    no such architecture or tag: a Hub repository ``timm/NAME`` of weights names the timm model they were trained as.
    Only a plain model name is looked up (timm's ``hf-hub:``/``local-dir:`` forms would read a configuration file)."""
    if not _PLAIN_NAME.fullmatch(name[len(PREFIX):]):
        return None
    try:
        return input_config(name).image_size
    except ConfigError:
        return None


def match_weights(tensors: dict[str, torch.Tensor], arch: str, origin: str) -> dict[str, torch.Tensor]:
    """A timm checkpoint's backbone tensors under :class:`TimmBackbone`'s names (``body.*``), checked.

    The checkpoint's classifier (timm's ``pretrained_cfg["classifier"]``, e.g. ``fc`` or ``head``)
    is dropped; every other tensor must be the backbone's, with its shape.

    Raises:
        ConfigError: a tensor the backbone lacks, one it needs that is missing, or another shape.
    """
    with torch.device("meta"):
        model = TimmBackbone(arch, 1)
    ours = {k: v for k, v in model.state_dict().items() if k.startswith("body.")}
    classifier = str(getattr(model.body, "pretrained_cfg", {}).get("classifier") or "fc")
    mapped = {f"body.{k}": t for k, t in tensors.items() if not (k == classifier or k.startswith(classifier + "."))}
    unknown = sorted(set(mapped) - set(ours))
    missing = sorted(k for k in set(ours) - set(mapped) if not k.endswith("num_batches_tracked"))
    if unknown or missing:
        what = f"it has {unknown[0][5:]}" if unknown else f"it lacks {missing[0][5:]}"
        raise ConfigError(f"{origin} does not match --arch {arch} ({what}); give the weights of that timm "
                          "architecture or pick the --arch they were trained as.")
    for key, tensor in mapped.items():
        if tuple(tensor.shape) != tuple(ours[key].shape):
            raise ConfigError(f"{origin} does not match --arch {arch} ({key[5:]} is {tuple(tensor.shape)}, not "
                              f"{tuple(ours[key].shape)}); give the weights of that timm architecture.")
    return {k: t.to(ours[k].dtype) for k, t in mapped.items()}


def timm_input(arch: str) -> TimmInput | None:
    """What the weights of ``--arch timm/NAME`` expect (:func:`input_config`); None for any other architecture."""
    return input_config(arch) if is_timm_arch(arch) else None
