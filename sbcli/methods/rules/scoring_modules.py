"""The scoring modules of the rules that score with more than the network's logits (torch; the rule files
import this module inside their builders only).

Each is one ``nn.Module`` from normalised images to scores over every seen class, built from the
network and the learner's extra tensors: that single module serves ``sb evaluate``, ``sb predict``
and the ONNX export (where it becomes part of the graph).
"""

from __future__ import annotations

import torch
from torch import nn

from sbcli.errors import ExportError
from sbcli.methods.rules.score_map import COEFFICIENTS_KEY, KNOTS_KEY, apply_map
from sbcli.nets.resnet import IncrementalResNet


class FeatureScores(nn.Module):
    """A rule's scores as a head on the network's pooled features: ``forward`` is
    ``score_features(model.forward_features(x))``, so that features computed once (a frozen backbone's,
    :mod:`sbcli.engine.feature_cache`) can be scored without the network."""

    model: IncrementalResNet

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.score_features(self.model.forward_features(x).float())

    def score_features(self, features: torch.Tensor) -> torch.Tensor:
        """Scores [B, C_seen] of pooled features [B, D] (float32)."""
        raise NotImplementedError


class NearestMeanScores(FeatureScores):
    """iCaRL's nearest-mean-of-exemplars rule: scores = -||f / ||f|| - mu_c||^2 for each class c."""

    def __init__(self, model: IncrementalResNet, class_means: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("means", class_means.detach().float().to(next(model.parameters()).device))

    def score_features(self, features: torch.Tensor) -> torch.Tensor:
        f = nn.functional.normalize(features, dim=1)
        # ||f - mu||^2 expanded into matrix products: no [B, C, D] intermediate, exports to plain MatMul
        sq = (f * f).sum(1, keepdim=True) - 2.0 * f @ self.means.t() + (self.means * self.means).sum(1)[None]
        return -sq


def nearest_mean_module(model: IncrementalResNet, extra: dict[str, torch.Tensor], key: str) -> nn.Module:
    """Scores of the ``nme`` rule from the class means the method stored in ``extra``."""
    means = stored_per_class(model, extra, key, "class means", "retrain its last step",
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


class PrototypeScores(FeatureScores):
    """SimpleCIL's rule: ``scale`` times the cosine similarity of the features to every class prototype, as one
    linear layer.

    The layer's weight is the normalised prototypes [C, D] times ``scale`` (no bias); its input the
    normalised pooled features, so the ONNX graph is the backbone, a normalisation and one MatMul. A
    positive scale changes the softmax's sharpness, never the ranking.
    """

    def __init__(self, model: IncrementalResNet, prototypes: torch.Tensor, scale: float = 1.0) -> None:
        super().__init__()
        self.model = model
        weight = nn.functional.normalize(prototypes.detach().float(), dim=1) * scale
        self.head = nn.Linear(weight.shape[1], weight.shape[0], bias=False).to(next(model.parameters()).device)
        with torch.no_grad():
            self.head.weight.copy_(weight)
        self.head.weight.requires_grad_(False)

    def score_features(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(nn.functional.normalize(features, dim=1))


def prototype_module(model: IncrementalResNet, extra: dict[str, torch.Tensor], key: str, scale_key: str) -> nn.Module:
    """Scores of the ``prototype`` rule (``--method simplecil``) from the prototypes and scale in ``extra``.

    A learner saved before the scale was fitted has none: its scores are the plain cosines (scale 1).

    Raises:
        ExportError: the prototypes are missing or misshaped, or the scale is not one positive number.
    """
    protos = stored_per_class(model, extra, key, "class prototypes", "pull or copy it again",
                              "scores by class prototypes", "it is damaged: pull or copy it again")
    scale = extra.get(scale_key)
    if scale is not None and (scale.numel() != 1 or not float(scale) > 0):
        raise ExportError(f"The stored '{scale_key}' is {scale.tolist()}, not one positive number; the learner is "
                          "inconsistent, pull or copy it again.")
    return PrototypeScores(model, protos, 1.0 if scale is None else float(scale))


class RidgeScores(FeatureScores):
    """RanPAC's rule: the ridge head on the ReLU of randomly projected features (``--method ranpac``).

    As a graph: the backbone, one MatMul and a ReLU (without a projection, neither), one MatMul; then, where the
    learner holds one, the increasing map of the scores (:mod:`sbcli.methods.rules.score_map`): a Sub, a ReLU
    and a MatMul.
    """

    def __init__(self, model: IncrementalResNet, projection: torch.Tensor | None, head: torch.Tensor,
                 bias: torch.Tensor | None = None, score_map: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.model = model
        device = next(model.parameters()).device
        self.register_buffer("projection", None if projection is None else projection.detach().float().to(device))
        knots, coefficients = (None, None) if score_map is None else (t.detach().float().to(device) for t in score_map)
        self.register_buffer("knots", knots)
        self.register_buffer("coefficients", coefficients)
        self.head = nn.Linear(head.shape[1], head.shape[0], bias=bias is not None).to(device)
        with torch.no_grad():
            self.head.weight.copy_(head.detach().float())
            if bias is not None:
                self.head.bias.copy_(bias.detach().float())
        self.head.requires_grad_(False)

    def score_features(self, features: torch.Tensor) -> torch.Tensor:
        h = features
        if self.projection is not None:
            h = torch.relu(h @ self.projection)
        scores = self.head(h)
        if self.coefficients is not None:
            scores = apply_map(scores, self.knots, self.coefficients)
        return scores


def ridge_module(model: IncrementalResNet, extra: dict[str, torch.Tensor], head_key: str,
                 projection_key: str, bias_key: str | None = None) -> nn.Module:
    """Scores of the ``ridge`` rule (and, with ``bias_key``, the ``lda`` rule's linear head with a bias) from the
    head (and projection) the method stored in ``extra``.

    Raises:
        ExportError: the head is missing or does not fit the network and the projection.
    """
    head, projection = extra.get(head_key), extra.get(projection_key)
    bias = None if bias_key is None else extra.get(bias_key)
    if bias_key is not None and (bias is None or head is None or bias.shape != (head.shape[0],)):
        raise ExportError(f"The learner scores with a discriminant head but its '{bias_key}' is missing or does not "
                          "fit the head; it is damaged: pull or copy it again.")
    width = model.num_features if projection is None else projection.shape[1]
    if head is None:
        raise ExportError("The learner scores with a ridge head but holds none; it is damaged: pull or copy it again.")
    if head.shape != (model.num_classes, width) or (projection is not None and projection.shape[0] != model.num_features):
        raise ExportError(f"The stored ridge head has shape {tuple(head.shape)}, not ({model.num_classes}, {width}); "
                          "the learner is inconsistent, pull or copy it again.")
    knots, coefficients = extra.get(KNOTS_KEY), extra.get(COEFFICIENTS_KEY)
    if (knots is None) != (coefficients is None) or (coefficients is not None and (
            knots.dim() != 1 or coefficients.shape != (len(knots) + 1,))):
        raise ExportError("The learner's map of its head's scores is missing a part or does not fit; it is damaged: "
                          "pull or copy it again.")
    mapped = knots is not None and not (len(knots) == 0 and float(coefficients[0]) == 1.0)  # the identity: no node
    return RidgeScores(model, projection, head, bias, (knots, coefficients) if mapped else None)
