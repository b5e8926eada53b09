"""One step of a class-incremental sequence: grow, learn, remember, evaluate, record.

This is the task loop the design gives the engine's side: methods only say their phases.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sbcli.data.device import DeviceData
from sbcli.data.imageset import ImageSet
from sbcli.engine import selection
from sbcli.engine.loop import Engine
from sbcli.learner.state import Learner, LearnerState
from sbcli.methods import METHODS, TaskContext, TaskResult
from sbcli.methods.balance import balanced_finetune
from sbcli.methods.base import balance_epochs
from sbcli.methods.common import frozen_copy, weight_align
from sbcli.methods.inference import outside_network, refresh_state, scores
from sbcli.methods.rules import RULES
from sbcli.metrics import StepMetrics, step_metrics
from sbcli.nets import create_model


@dataclass(frozen=True)
class StepSummary:
    """What the CLI shows after a step."""

    step: int
    num_classes: int
    metrics: StepMetrics
    seconds: float
    notes: list[str] = field(default_factory=list)  # what the CLI should also say (test data used, stale files)
    state: LearnerState | None = None  # the learner as saved after the step (filled by api.add_task, for its caller)


def evaluate_learner(learner: Learner, engine: Engine, test: ImageSet, *, network: bool = False) -> StepMetrics:
    """Metrics of the learner's current model on ``test`` (labels in the learner's order).

    Under the learner's inference rule, or with ``network`` under the network's own output (its
    logits, whatever the rule: what iCaRL's nearest mean or BiC's correction start from).
    """
    if len(test) == 0:
        nan = float("nan")
        return StepMetrics(nan, [nan] * (max(learner.state.class_task) + 1), nan, nan, nan, nan)
    if network:
        out = engine.logits(learner.model, test.images)
    else:
        out = scores(learner.model, learner.extra, _rule(learner), engine, test.images)
    return step_metrics(out, test.labels, learner.state.class_task)


def _rule(learner: Learner) -> str:
    return learner.state.method_config.inference


def learn_step(learner: Learner, train: ImageSet, test: ImageSet, new_classes: list[str], engine: Engine,
               task_record: dict, seen_train: Callable[[], ImageSet] | None = None) -> StepSummary:
    """Learn one task of ``new_classes`` (``train`` labels already in the learner's order).

    ``seen_train``, when the caller has them, returns the training images of every class seen so
    far including the new ones (for the joint oracle).
    """
    start = time.perf_counter()
    state, step = learner.state, learner.state.steps
    num_old = state.num_classes
    teacher = frozen_copy(learner.model) if step > 0 else None
    state.class_names.extend(new_classes)
    state.class_task.extend([step] * len(new_classes))
    if step > 0:
        learner.model.expand_classes(len(new_classes))
    fraction = state.train_config.val_fraction  # --val-fraction: held out of new images and exemplars
    parts, held = selection.split([(train.images, train.labels), learner.memory.tensors()], fraction,
                                  state.seed * 1000 + step)
    data = DeviceData.join(parts, engine.device)
    validator = None if held is None else selection.Validator(
        held[0], held[1], state.num_classes, state.train_config.val_every)
    method = METHODS.get(state.method)
    cfg = state.method_config
    engine = engine.for_step(step + 1, validator)
    balance = _balance_epochs(learner, step)
    align_last = balance > 0 and RULES.get(cfg.inference).aligns and state.train_config.balance_before_wa
    ctx = TaskContext(step=step, model=learner.model, teacher=teacher, data=data, num_old=num_old,
                      num_total=state.num_classes, engine=engine, epochs=state.train_config.epochs,
                      evaluate=lambda: evaluate_learner(learner, engine, test),
                      make_aux_model=lambda n: create_model(state.arch, n, state.width).to(engine.device),
                      extra=dict(learner.extra), memory_budget=learner.memory.budget,
                      seen_data=None if seen_train is None else lambda: _on_device(seen_train(), engine),
                      align=not align_last, seed=state.seed)
    result = method.learn_task(ctx, cfg)
    learner.extra.update(result.extra_state)
    learner.memory.update(train.images, train.labels, state.num_classes, lambda x: engine.features(learner.model, x))
    learner.extra.update(refresh_state(cfg, learner.model, *learner.memory.tensors(), engine))
    balanced = _balance(learner, engine, balance, cfg.inference, result, test)
    if align_last:  # --balance-before-wa: the method left the aligning to after the fine-tuning
        result.record["before_wa"] = evaluate_learner(learner, engine, test).to_json()
        result.record["wa_factor"] = weight_align(learner.model, num_old)
    if balanced or align_last:
        learner.extra.update(refresh_state(cfg, learner.model, *learner.memory.tensors(), engine))
    metrics = evaluate_learner(learner, engine, test)
    entry = {"step": step + 1, "num_classes": state.num_classes, "metrics": metrics.to_json()}
    if outside_network(cfg.inference) and not method.frozen_backbone:  # the rule's accuracy and the network's
        # (a frozen backbone's head is never trained: its accuracy would be chance, and scoring it a wasted pass)
        entry["network_metrics"] = evaluate_learner(learner, engine, test, network=True).to_json()
    seconds = time.perf_counter() - start
    state.tasks.append(task_record)
    state.history.append({**entry, "phases": [p.to_json() for p in result.phases], "record": result.record,
                          "seconds": round(seconds, 2), "train_config": dataclasses.asdict(state.train_config)})  # this step's own
    return StepSummary(step + 1, state.num_classes, metrics, seconds)


def _balance(learner: Learner, engine: Engine, epochs: int, inference: str, result: TaskResult, test: ImageSet) -> bool:
    """--balance-epochs: ``epochs`` of class-balanced fine-tuning on the updated memory (sbcli.methods.balance).

    ``epochs`` comes from :func:`_balance_epochs`: 0 under BiC, whose bias layer was fit on the network as
    the step left it (the config layer drops the default and refuses an asked one; this guards learners
    written otherwise). Records the
    accuracy before it (``before_balance``) and its phase; True when it ran.
    """
    tc = learner.state.train_config
    if epochs <= 0 or len(learner.memory) == 0:
        return False
    engine = engine.for_step(engine.task)  # the held-out images picked the method's epochs; this phase keeps its last
    result.record["before_balance"] = evaluate_learner(learner, engine, test).to_json()
    report = balanced_finetune(learner.model, learner.memory.tensors(), engine, epochs, tc.balance_lr,
                               hold_bias_at_zero=RULES.get(inference).aligns)
    if report is not None:
        result.phases.append(report)
    return report is not None


def _balance_epochs(learner: Learner, step: int) -> int:
    """The class-balanced fine-tuning epochs after ``step`` (0 after the first, or where the rule takes none)."""
    if step == 0 or learner.memory.budget <= 0:
        return 0
    state = learner.state
    return balance_epochs(state.method, state.method_config, state.train_config.balance_epochs, asked=False)


def _on_device(images: ImageSet, engine: Engine) -> DeviceData:
    return DeviceData.join([(images.images, images.labels)], engine.device)
