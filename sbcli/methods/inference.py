"""Scores over every seen class for a learner's inference rule.

``wa`` and ``none`` live in the network's weights (WA is applied to the head), so their scores
are the logits. ``bic`` folds the last step's bias layer (``extra["bic.scale"]``,
``extra["bic.shift"]``) into a copy of the head, so it too is a plain network. Rules that need more
than the forward pass register a *scoring module* here by name
(:func:`register_scoring_module`): one ``nn.Module`` from normalised images to scores, built from
the model and the learner's extra tensors. That single definition serves ``sb evaluate``,
``sb predict`` and the ONNX export (where it becomes part of the graph). ``nme`` (iCaRL's nearest
mean of exemplars, class means in ``extra["nme.class_means"]``) is registered here, and again as
``icarl`` (the STD training with iCaRL's loss, whose class means are rebuilt after every memory
update by the refresh registered for it in :data:`STATE_REFRESH`). Both registries are filled
once, by this module's own definitions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sbcli.engine.loop import Engine
from sbcli.errors import ExportError
from sbcli.methods import bic, nme, ranpac, simplecil
from sbcli.methods.memory import FeatureFn
from sbcli.nets.resnet import IncrementalResNet
from sbcli.registry import Registry


def scores(model: IncrementalResNet, extra: dict[str, torch.Tensor], inference: str, engine: Engine,
           images: torch.Tensor) -> torch.Tensor:
    """Scores [N, C_seen] of uint8 images under the named inference rule."""
    return engine.logits(scoring_module(model, extra, inference), images)


ModuleBuilder = Callable[[IncrementalResNet, dict[str, torch.Tensor]], nn.Module]
SCORING_MODULES: Registry[ModuleBuilder] = Registry("scoring module")


def register_scoring_module(name: str) -> Callable[[ModuleBuilder], ModuleBuilder]:
    """Register ``builder(model, extra) -> nn.Module`` (normalised images -> scores) for a rule.

    Raises:
        ConfigError: the rule already has a scoring module.
    """
    return SCORING_MODULES.register(name)


def scoring_module(model: IncrementalResNet, extra: dict[str, torch.Tensor], inference: str) -> nn.Module:
    """The rule's scores as one module of normalised images [B, 3, H, W] -> [B, C_seen].

    Rules in the weights (``none``, ``wa``, ...) give the model itself. The module is in the
    model's train/eval mode.
    """
    builder = SCORING_MODULES.find(inference)
    module = model if builder is None else builder(model, extra)
    return module.train(model.training)


def outside_network(inference: str) -> bool:
    """Whether the rule scores with more than the network's own logits (a scoring module of its own)."""
    return inference in SCORING_MODULES


NME_MEANS = nme.MEANS_KEY  # "nme.class_means"


class NearestMeanScores(nn.Module):
    """iCaRL's nearest-mean-of-exemplars rule: scores = -||f / ||f|| - mu_c||^2 for each class c."""

    def __init__(self, model: IncrementalResNet, class_means: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("means", class_means.detach().float().to(next(model.parameters()).device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = nn.functional.normalize(self.model.forward_features(x).float(), dim=1)
        # ||f - mu||^2 expanded into matrix products: no [B, C, D] intermediate, exports to plain MatMul
        sq = (f * f).sum(1, keepdim=True) - 2.0 * f @ self.means.t() + (self.means * self.means).sum(1)[None]
        return -sq


@register_scoring_module("nme")
def nearest_mean_module(model: IncrementalResNet, extra: dict[str, torch.Tensor]) -> nn.Module:
    """Scores of the ``nme`` rule from the class means the method stored in ``extra``."""
    means = stored_per_class(model, extra, NME_MEANS, "class means", "retrain its last step",
                             "uses nearest-mean inference", "re-run its last step with a method that stores class means")
    return NearestMeanScores(model, means)


def stored_per_class(model: IncrementalResNet, extra: dict[str, torch.Tensor], key: str, what: str, fix: str,
                     rule: str, missing_fix: str) -> torch.Tensor:
    """The [classes, features] tensor ``key`` a scoring rule reads from the learner's state.

    Raises:
        ExportError: it is missing, or its shape does not match the network.
    """
    value = extra.get(key)
    if value is None:
        raise ExportError(f"The learner {rule} but holds no '{key}' tensor; {missing_fix}.")
    if value.shape != (model.num_classes, model.num_features):
        raise ExportError(f"The stored {what} have shape {tuple(value.shape)}, not "
                          f"({model.num_classes}, {model.num_features}); the learner is inconsistent, {fix}.")
    return value


register_scoring_module("icarl")(nearest_mean_module)


class PrototypeScores(nn.Module):
    """SimpleCIL's rule: cosine similarity of the features to every class prototype, as one linear layer.

    The layer's weight is the normalised prototypes [C, D] (no bias); its input the normalised
    pooled features, so the ONNX graph is the backbone, a normalisation and one MatMul.
    """

    def __init__(self, model: IncrementalResNet, prototypes: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        weight = nn.functional.normalize(prototypes.detach().float(), dim=1)
        self.head = nn.Linear(weight.shape[1], weight.shape[0], bias=False).to(next(model.parameters()).device)
        with torch.no_grad():
            self.head.weight.copy_(weight)
        self.head.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(nn.functional.normalize(self.model.forward_features(x).float(), dim=1))


@register_scoring_module("prototype")
def prototype_module(model: IncrementalResNet, extra: dict[str, torch.Tensor]) -> nn.Module:
    """Scores of the ``prototype`` rule (``--method simplecil``) from the prototypes in ``extra``."""
    protos = stored_per_class(model, extra, simplecil.PROTOTYPES_KEY, "class prototypes", "pull or copy it again",
                              "scores by class prototypes", "it is damaged: pull or copy it again")
    return PrototypeScores(model, protos)
register_scoring_module("bic")(bic.fold_correction)


class RidgeScores(nn.Module):
    """RanPAC's rule: the ridge head on the ReLU of randomly projected features (``--method ranpac``).

    As a graph: the backbone, one MatMul and a ReLU (without a projection, neither), one MatMul.
    """

    def __init__(self, model: IncrementalResNet, projection: torch.Tensor | None, head: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        device = next(model.parameters()).device
        self.register_buffer("projection", None if projection is None else projection.detach().float().to(device))
        self.head = nn.Linear(head.shape[1], head.shape[0], bias=False).to(device)
        with torch.no_grad():
            self.head.weight.copy_(head.detach().float())
        self.head.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.model.forward_features(x).float()
        if self.projection is not None:
            h = torch.relu(h @ self.projection)
        return self.head(h)


@register_scoring_module("ridge")
def ridge_module(model: IncrementalResNet, extra: dict[str, torch.Tensor]) -> nn.Module:
    """Scores of the ``ridge`` rule from the head (and projection) the method stored in ``extra``.

    Raises:
        ExportError: the head is missing or does not fit the network and the projection.
    """
    head, projection = extra.get(ranpac.HEAD), extra.get(ranpac.PROJECTION)
    width = model.num_features if projection is None else projection.shape[1]
    if head is None:
        raise ExportError("The learner scores with a ridge head but holds none; it is damaged: pull or copy it again.")
    if head.shape != (model.num_classes, width) or (projection is not None and projection.shape[0] != model.num_features):
        raise ExportError(f"The stored ridge head has shape {tuple(head.shape)}, not ({model.num_classes}, {width}); "
                          "the learner is inconsistent, pull or copy it again.")
    return RidgeScores(model, projection, head)


StateRefresh = Callable[[IncrementalResNet, torch.Tensor, torch.Tensor, FeatureFn, Any], dict[str, torch.Tensor]]
STATE_REFRESH: Registry[StateRefresh] = Registry("state refresh")
STATE_REFRESH.register("icarl")(nme.refresh_means)


def refresh_state(cfg: Any, model: IncrementalResNet, images: torch.Tensor, labels: torch.Tensor,
                  engine: Engine) -> dict[str, torch.Tensor]:
    """The state of ``cfg.inference`` rebuilt from the exemplars ``images``/``labels`` after a memory update.

    ``cfg`` is the method's Config: a refresh may read its settings (iCaRL's ``nme_flips``).

    Empty for rules whose state does not depend on the memory (all but ``icarl``).
    """
    refresh = STATE_REFRESH.find(cfg.inference)
    return {} if refresh is None else refresh(model, images, labels, lambda x: engine.features(model, x), cfg)
