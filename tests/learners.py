"""One cached factory of small learners built directly (no training), for every test that needs one.

A learner for each set of arguments is built once per test session; each call returns a deep copy
(a test may change or save it freely) and leaves torch's global random state exactly as building
it would have, so a test sees the same numbers whether its learner was built or copied.
"""

from __future__ import annotations

import copy
import functools

import torch

from sbcli.engine.loop import TrainConfig
from sbcli.learner.records import MemorySettings, Provenance, StepRecord, TaskRecord
from sbcli.learner.state import Learner, LearnerState
from sbcli.methods import build_config
from sbcli.methods.memory import ExemplarMemory
from sbcli.metrics import StepMetrics
from sbcli.nets import create_model

SIZE = 16
NORM = {"mean": [0.45, 0.4, 0.35], "std": [0.25, 0.2, 0.3]}


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Random BatchNorm statistics and head bias, so eval-mode folding is really exercised."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.rand(m.num_features, generator=gen) - 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(m.num_features, generator=gen) - 0.5)
        model.head.bias.copy_(torch.randn(model.num_classes, generator=gen))


def make_learner(method: str = "std", tasks: tuple[int, ...] = (3, 2), exemplars: int = 10, seed: int = 0,
                 size: int = SIZE) -> Learner:
    """A learner built directly (no training): random weights, random exemplar images (a fresh copy)."""
    learner, rng_after = _built(method, tuple(tasks), exemplars, seed, size)
    torch.set_rng_state(rng_after)
    return copy.deepcopy(learner)


@functools.lru_cache(maxsize=None)
def _built(method: str, tasks: tuple[int, ...], exemplars: int, seed: int, size: int) -> tuple[Learner, torch.Tensor]:
    learner = _build(method, tasks, exemplars, seed, size)
    return learner, torch.get_rng_state()


def _build(method: str, tasks: tuple[int, ...], exemplars: int, seed: int, size: int) -> Learner:
    torch.manual_seed(seed)
    names = [f"class_{i}" for i in range(sum(tasks))]
    owner = [t for t, n in enumerate(tasks) for _ in range(n)]
    history = [StepRecord(t + 1, sum(tasks[: t + 1]), StepMetrics(50.0, [50.0] * (t + 1), 40.0, 60.0, 45.0, 70.0),
                          seconds=1.0)
               for t in range(len(tasks))]
    state = LearnerState(arch="resnet18", width=0.125, image_size=size, normalization=NORM, method=method,
                         method_config=build_config(method, {}), train_config=TrainConfig(epochs=1),
                         memory=MemorySettings(exemplars, "random", 0), seed=0, class_names=names,
                         class_task=owner, tasks=[TaskRecord([n for n, t in zip(names, owner, strict=True) if t == i],
                                                             {"kind": "demo"}) for i in range(len(tasks))],
                         history=history, provenance=Provenance(dataset="synthetic", sbcli_version="test"))
    model = create_model("resnet18", len(names), 0.125)
    randomize(model, seed)
    memory = ExemplarMemory(exemplars, "random", 0)
    if exemplars:
        gen = torch.Generator().manual_seed(seed + 1)
        memory.images = torch.randint(0, 256, (exemplars, 3, size, size), dtype=torch.uint8, generator=gen)
        memory.labels = torch.arange(exemplars) % len(names)
    return Learner(state, model.eval(), memory)
