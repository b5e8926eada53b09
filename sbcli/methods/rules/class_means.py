"""iCaRL's class means for its nearest-mean-of-exemplars (NME) inference.

Each class's mean is taken over the L2-normalised pooled features of its exemplars and of their
horizontal flips, then normalised again (Rebuffi et al. 2017: the paper's normalised features,
the flips of the authors' code; ``--no-nme-flips`` leaves the flips out, as PyCIL does). The means are rebuilt
after every memory update, with the model that chose the memory, and kept in the learner as the
``nme.class_means`` tensor [C_seen, D]; the scoring module of :mod:`sbcli.methods.inference` scores an
image by the negative squared distance of its normalised features to every mean, so the argmax
is the nearest mean and slicing the scores by class (intra-old, intra-new) stays meaningful.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from sbcli.errors import ConfigError
from sbcli.methods.rules.nme import MEANS_KEY  # the rule scores with what is kept under it
from sbcli.nets.resnet import IncrementalResNet

FeatureFn = Callable[[torch.Tensor], torch.Tensor]  # uint8 images [N, 3, H, W] -> pooled features [N, D]


def class_means(features: FeatureFn, images: torch.Tensor, labels: torch.Tensor, num_classes: int,
                flips: bool = True) -> torch.Tensor:
    """Unit-norm mean of the normalised features of each class's images (and, with ``flips``, their flips).

    Args:
        features: uint8 images [N, 3, H, W] -> pooled features [N, D].
        images: the exemplars.
        labels: their classes, in ``range(num_classes)``.
        num_classes: the classes to return a mean for.
        flips: add the horizontally flipped images (iCaRL's code); False: the images alone (PyCIL).

    Raises:
        ConfigError: a class has no exemplar (the memory is smaller than the number of classes).
    """
    feats = F.normalize(features(images), dim=1)
    if flips:
        feats = feats + F.normalize(features(images.flip(-1)), dim=1)
    labels = labels.to(feats.device)
    counts = torch.bincount(labels, minlength=num_classes)[:num_classes]
    if bool((counts == 0).any()):
        missing = int((counts == 0).sum())
        raise ConfigError(f"--inference icarl needs exemplars of every class, but {missing} class(es) have none; "
                          "raise --memory to at least one exemplar per class.")
    sums = torch.zeros(num_classes, feats.shape[1], dtype=feats.dtype, device=feats.device).index_add_(0, labels, feats)
    return F.normalize(sums / counts[:, None], dim=1)


def refresh_means(model: IncrementalResNet, images: torch.Tensor, labels: torch.Tensor,
                  features: FeatureFn, cfg: Any) -> dict[str, torch.Tensor]:
    """The class means of the exemplars ``images``/``labels`` under ``model`` (after a memory update).

    ``features`` gives ``model``'s pooled features of uint8 images; ``cfg`` is the method's Config
    (its ``nme_flips`` says whether the flipped exemplars count too).
    """
    means = class_means(features, images, labels, model.num_classes, flips=getattr(cfg, "nme_flips", True))
    return {MEANS_KEY: means.cpu()}
