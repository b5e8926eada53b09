"""One step of a class-incremental sequence: grow, learn, remember, evaluate, record.

This is the task loop the design gives the engine's side: methods only say their phases.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sbcli.data.device import DeviceData
from sbcli.data.imageset import ImageSet
from sbcli.engine import selection
from sbcli.engine.loop import Engine
from sbcli.learner.records import StepRecord, TaskRecord
from sbcli.learner.state import Learner, LearnerState
from sbcli.methods import METHODS, TaskContext, TaskResult
from sbcli.methods.balance import balanced_finetune
from sbcli.methods.base import balance_epochs
from sbcli.methods.teachers import frozen_copy
from sbcli.methods.inference import outside_network, refresh_state
from sbcli.methods.rules import RULES
from sbcli.methods.rules.stages import BalanceReport, record_json
from sbcli.metrics import StepMetrics
from sbcli.nets import create_model
from sbcli.run.evaluation import evaluate_learner, feature_cache_for


@dataclass(frozen=True)
class StepSummary:
    """What the CLI shows after a step."""

    step: int
    num_classes: int
    metrics: StepMetrics
    seconds: float
    notes: list[str] = field(default_factory=list)  # what the CLI should also say (test data used, stale files)
    state: LearnerState | None = None  # the learner as saved after the step (filled by api.add_task, for its caller)


def learn_step(learner: Learner, train: ImageSet, test: ImageSet, new_classes: list[str], engine: Engine,
               task_record: TaskRecord, seen_train: Callable[[], ImageSet] | None = None,
               features: torch.Tensor | None = None, known_images: int = 0) -> StepSummary:
    """Learn one task of ``new_classes`` (``train`` labels already in the learner's order).

    ``seen_train``, when the caller has them, returns the training images of every class seen so
    far including the new ones (for the joint oracle). ``features``: the pooled features of ``train``'s
    images, computed while they were streamed (``train`` then holds their labels alone,
    :meth:`ImageSet.labels_only`), for a method that streams and a learner that keeps no exemplars.
    ``known_images``: how many of ``train``'s images are of classes learned before (recorded with the step).
    """
    start = time.perf_counter()
    state, step = learner.state, learner.state.steps
    cfg = state.method_config
    balance = _balance_epochs(learner, step)  # what the step runs after the method's phases, decided first
    align_last = balance > 0 and RULES.get(cfg.inference).aligns and state.train_config.balance_before_wa
    num_old = state.num_classes
    teacher = frozen_copy(learner.model) if step > 0 else None
    state.class_names.extend(new_classes)
    state.class_task.extend([step] * len(new_classes))
    state.tasks.append(task_record)  # the step's task from here on: what evaluation measures as current
    learner.model.expand_classes(state.num_classes - learner.model.num_classes)  # a first head may already fit
    fraction = state.train_config.val_fraction  # --val-fraction: held out of new images and exemplars
    parts, held = selection.split([train.tensors(), learner.memory.tensors()], fraction, state.seed * 1000 + step)
    data = DeviceData.join(parts, engine.device)
    validator = None if held is None else selection.Validator(
        held[0], held[1], state.num_classes, state.train_config.val_every)
    method = METHODS.get(state.method)
    after_phases = engine.for_step(step + 1)  # what follows the method's phases uses no held-out images
    engine = engine.for_step(step + 1, validator)
    ctx = TaskContext(step=step, model=learner.model, teacher=teacher, data=data,
                      seen_data=None if seen_train is None else (
                          lambda: DeviceData.join([seen_train().tensors()], engine.device)),
                      num_old=num_old, num_total=state.num_classes, engine=engine, epochs=state.train_config.epochs,
                      evaluate=lambda: evaluate_learner(learner, engine, test),
                      make_aux_model=lambda n: create_model(state.arch, n, state.width).to(engine.device),
                      extra=dict(learner.extra), memory_budget=learner.memory.budget,
                      seed=state.seed, features=features)
    result = method.learn_task(ctx, cfg)
    learner.extra.update(result.extra_state)
    metrics, network = _settle(learner, after_phases, result, train, test, balance, align_last, num_old,
                               measure_network=outside_network(cfg.inference) and not method.frozen_backbone)
    seconds = time.perf_counter() - start
    state.history.append(StepRecord(step + 1, state.num_classes, metrics, network, [p.to_json() for p in result.phases],
                                    record_json(result.record, result.stages), round(seconds, 2),
                                    dataclasses.asdict(state.train_config),  # this step's own settings
                                    known_images=known_images or None))
    return StepSummary(step + 1, state.num_classes, metrics, seconds)


def _settle(learner: Learner, engine: Engine, result: TaskResult, train: ImageSet, test: ImageSet, balance: int,
            align_last: bool, num_old: int, measure_network: bool) -> tuple[StepMetrics, StepMetrics | None]:
    """What follows the method's phases, in one place: the exemplar memory takes the new classes, then the
    stages the inference rule declares (:attr:`InferenceRule.stages`), in order: refresh (the rule's state
    rebuilt from the memory); align (the rule's :attr:`InferenceRule.align`, after the step's first task;
    an :class:`AlignReport`, with the accuracy just before it unless the method's record holds it); with
    ``balance`` epochs (:func:`_balance_epochs`) and exemplars, balance (class-balanced fine-tuning on the
    memory, :mod:`sbcli.methods.balance`; the accuracy before it in a :class:`BalanceReport`). With
    ``align_last`` (``--balance-before-wa``) balance comes before align. The rule's state is rebuilt once more
    after either changed the network. The reports go, typed, into ``result.stages`` (written into the step's
    record by :func:`record_json`); then the step's metrics under the rule and, with ``measure_network``,
    under the network's own logits (what iCaRL's nearest mean or BiC's correction start from; a frozen
    backbone's head is never trained: its accuracy would be chance)."""
    cfg, memory = learner.state.method_config, learner.memory
    rule = RULES.get(cfg.inference)
    stages = rule.stages

    def features(images: torch.Tensor) -> torch.Tensor:  # of the model as it is now: what memory and rule keep
        return engine.features(learner.model, images)

    def refresh() -> None:  # the refresh stage: the rule's state rebuilt from the memory
        learner.extra.update(refresh_state(cfg, learner.model, *memory.tensors(), features))

    def accuracy() -> StepMetrics:
        return evaluate_learner(learner, engine, test)

    def align() -> None:  # the align stage (WA leaves the features, and so the memory's choice, as they were)
        before = accuracy() if result.accuracy_before_align else None
        result.stages.append(rule.align(learner.model, num_old, before))

    memory.update(train.images, train.labels, learner.state.num_classes, features)
    if "refresh" in stages:
        refresh()
    aligns = "align" in stages and num_old > 0  # the first task has no old rows to align to
    if aligns and not align_last:
        align()
    balanced = "balance" in stages and balance > 0 and len(memory) > 0
    if balanced:  # the balance stage
        before = accuracy()
        result.phases.append(balanced_finetune(learner.model, memory.tensors(), engine, balance,
                                               learner.state.train_config.balance_lr,
                                               hold_bias_at_zero="align" in stages))
        result.stages.append(BalanceReport(before))
    if aligns and align_last:
        align()
    if (balanced or aligns) and "refresh" in stages:
        refresh()
    metrics = evaluate_learner(learner, engine, test, cache=feature_cache_for(learner.state.method))
    return metrics, evaluate_learner(learner, engine, test, network=True) if measure_network else None


def _balance_epochs(learner: Learner, step: int) -> int:
    """The class-balanced fine-tuning epochs after ``step`` (0 after the first, or where the rule takes none)."""
    if step == 0 or learner.memory.budget <= 0:
        return 0
    state = learner.state
    return balance_epochs(state.method, state.method_config, state.train_config.balance_epochs, asked=False)
