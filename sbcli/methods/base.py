"""What a method is: a Config dataclass and ``learn_task(ctx, cfg) -> TaskResult``.

The engine owns the task loop (grow the head, call ``learn_task``, update the memory,
evaluate, save); a method owns only what differs, written as a short list of phases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from sbcli.data.device import DeviceData
from sbcli.engine.loop import Engine, PhaseReport
from sbcli.errors import ConfigError
from sbcli.metrics import StepMetrics
from sbcli.nets.resnet import IncrementalResNet
from sbcli.registry import Registry


@dataclass
class TaskContext:
    """Everything a method may use to learn one task.

    ``model`` already has its head grown to ``num_total`` classes; ``teacher`` is a frozen copy of
    the model after the previous step (None at step 0); ``data`` holds the new task's images plus
    the exemplars, on the device; ``evaluate`` measures the current model on the test images of
    every seen class (for the per-phase records of an ablation). ``extra`` is the method state
    the learner kept from the previous step (e.g. BiC's correction); ``memory_budget`` the total
    exemplar budget; ``seen_data`` returns the training images of every class seen so far, on the
    device, when the sequence has them (``api.train``), and is None when it does not (``add-task``).
    """

    step: int
    model: IncrementalResNet
    teacher: IncrementalResNet | None
    data: DeviceData
    num_old: int
    num_total: int
    engine: Engine
    epochs: int
    evaluate: Callable[[], StepMetrics]
    make_aux_model: Callable[[int], IncrementalResNet] | None = None
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    memory_budget: int = 0
    seen_data: Callable[[], DeviceData] | None = None

    @property
    def lam(self) -> float:
        """lambda = C_old / C_total."""
        return self.num_old / self.num_total


@dataclass
class TaskResult:
    """The phases a method ran and anything it wants kept in the learner's history."""

    phases: list[PhaseReport] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)
    extra_state: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class MethodSpec:
    name: str
    config: type
    learn_task: Callable[[TaskContext, Any], TaskResult]
    summary: str


METHODS: Registry[MethodSpec] = Registry("method")


def register_method(name: str, config: type, summary: str) -> Callable:
    """Decorator: register ``learn_task`` under ``name`` with its Config dataclass."""

    def add(fn: Callable[[TaskContext, Any], TaskResult]) -> Callable[[TaskContext, Any], TaskResult]:
        METHODS.register(name)(MethodSpec(name, config, fn, summary))
        return fn

    return add


def build_config(name: str, options: dict[str, Any]) -> Any:
    """The method's Config from options; ``None`` means unset (the method's default holds).

    Raises:
        ConfigError: an option that the method does not take, or a value it refuses.
    """
    spec = METHODS.get(name)
    known = {f.name for f in dataclasses.fields(spec.config)}
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - known)
    if unknown:
        flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
        raise ConfigError(f"{flags} does not apply to --method {name}; drop it or pick a method that takes it.")
    return spec.config(**given)


def config_from_json(name: str, data: dict[str, Any]) -> Any:
    """Rebuild a stored method Config (tuples come back from JSON as lists)."""
    spec = METHODS.get(name)
    types = {f.name: f.type for f in dataclasses.fields(spec.config)}
    fixed = {k: tuple(v) if isinstance(v, list) and "tuple" in str(types.get(k, "")) else v for k, v in data.items()}
    return spec.config(**fixed)
