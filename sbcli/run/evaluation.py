"""How a learner does on test images: under its inference rule (:func:`evaluate_learner`, what every step records),
and `sb evaluate` on a learner on disk (now, or at a kept step), on a folder or on its own test sets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from sbcli.data.catalog import open_spec, relabel, resolve_spec
from sbcli.data.imageset import ImageSet
from sbcli.engine.hardware import exact_float32, resolve_device
from sbcli.engine.feature_cache import FeatureCache
from sbcli.engine.loop import Engine
from sbcli.errors import DataError
from sbcli.learner.records import StepRecord
from sbcli.learner.state import Learner
from sbcli.methods import METHODS
from sbcli.methods.inference import scoring_module
from sbcli.methods.rules.scoring_modules import FeatureScores
from sbcli.metrics import StepMetrics, Summary, history_summary, step_metrics
from sbcli.run import evalsets
from sbcli.run.evalsets import TestDataReport


@dataclass(frozen=True)
class Evaluation:
    """What `sb evaluate` measured (:func:`sbcli.api.evaluate`): the learner now (or at the step asked) on
    ``test_images`` images (``test_data`` says which), its history and the history's summary.

    ``to_json`` is ``sb evaluate --json``'s object.
    """

    learner: str
    method: str
    classes: int
    steps: int
    test_images: int
    test_data: TestDataReport
    metrics: StepMetrics
    history: list[StepRecord]
    summary: Summary

    @property
    def accuracy_matrix(self) -> list[list[float]]:
        """Row t: the accuracy on each task's classes after step t + 1."""
        return [h.metrics.per_task for h in self.history]

    def to_json(self) -> dict:
        return {"learner": self.learner, "method": self.method, "classes": self.classes, "steps": self.steps,
                "test_images": self.test_images, "test_data": self.test_data.to_json(), "metrics": self.metrics.to_json(),
                "history": [h.to_json() for h in self.history], "accuracy_matrix": self.accuracy_matrix,
                "summary": self.summary.to_json()}


def evaluate_learner(learner: Learner, engine: Engine, test: ImageSet, *, network: bool = False,
                     cache: FeatureCache | None = None) -> StepMetrics:
    """Metrics of the learner's current model on ``test`` (labels in the learner's order).

    Under the learner's inference rule, or with ``network`` under the network's own output (its
    logits, whatever the rule: what iCaRL's nearest mean or BiC's correction start from). With
    ``cache`` (a frozen backbone's learner, :func:`feature_cache_for`), a rule that scores pooled
    features reads the features of images it has met before from the cache.
    """
    state = learner.state
    current = max(len(state.tasks) - 1, max(state.class_task, default=0))  # the step's task: it may have brought no class
    if len(test) == 0:
        nan = float("nan")
        return StepMetrics(nan, [nan] * (current + 1), nan, nan, nan, nan)
    rule = learner.state.method_config.inference
    model = learner.model if network else scoring_module(learner.model, learner.extra, rule)
    if cache is not None and isinstance(model, FeatureScores) and not engine.dist.enabled:
        scores = _scores_from_features(model, engine, test, cache)
    else:
        scores = engine.logits(model, test.images)
    return step_metrics(scores, test.labels, state.class_task, current)


def feature_cache_for(method: str) -> FeatureCache | None:
    """The feature cache for a learner of ``method``: only a backbone that never changes after step 1 has
    features worth keeping."""
    return FeatureCache.default() if METHODS.get(method).frozen_backbone else None


@torch.no_grad()
def _scores_from_features(module: FeatureScores, engine: Engine, test: ImageSet, cache: FeatureCache) -> torch.Tensor:
    """The rule's scores of ``test`` from pooled features, cached per class (:mod:`sbcli.engine.feature_cache`)."""
    context = {"norm": engine.norm.to_json(), "device": engine.device.type, "runtime": engine.feature_runtime()}
    features = cache.features(module.model, test.images, test.labels, context,
                              lambda images: engine.frozen_features(module.model, images))
    with exact_float32(engine.device):
        return torch.cat([module.score_features(part.to(engine.device)).float().cpu()
                          for part in features.split(engine.cfg.eval_batch_size)])


def evaluate(learner_dir: Path, folder: Path | None = None, *, device: str = "auto", step: int | None = None,
             data_roots: list[Path] | None = None) -> Evaluation:
    """Accuracy of the learner, its history and summary, and which test images were used (:func:`sbcli.api.evaluate`)."""
    dev = resolve_device(device)
    learner = Learner.load(learner_dir, dev, step)
    state = learner.state
    state.require_classes("evaluate")
    if folder is not None:
        spec = resolve_spec(str(folder), test=None, image_size=state.image_size, data_root=None, download=False)
        images = open_spec(spec, train=True, test=False).train
        unknown = sorted(set(images.class_names) - set(state.class_names))
        if unknown:
            raise DataError(f"{folder} has classes the learner does not know ({', '.join(unknown)}); remove those folders.")
        test = relabel(images, state.class_names, images.class_names)
        used = TestDataReport.of_folder(folder)
    else:
        chosen = evalsets.test_data(learner, data_roots, required=learner_dir)
        test, used = chosen.test, chosen.report()
    engine = Engine(state.train_config, dev, learner.norm, state.seed)
    metrics = evaluate_learner(learner, engine, test, cache=feature_cache_for(state.method))
    return Evaluation(str(learner_dir), state.method, state.num_classes, state.steps, len(test), used, metrics,
                      state.history, history_summary(state.history))
