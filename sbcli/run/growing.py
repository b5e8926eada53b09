"""Growing a learner that came from elsewhere: the memory rule and the files that go stale.

A learner pushed without ``--with-memory`` arrives with no exemplars of its classes. Growing it as
if nothing were missing would rehearse nothing of the old classes, silently; so ``add-task``
refuses it, unless ``--no-rehearsal`` asks for distillation alone. A pulled learner also holds the
model card and ONNX file of the step it was pushed at; after ``add-task`` these no longer describe
it, and the terminal says what became of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from sbcli.errors import ConfigError, LearnerError
from sbcli.learner.state import Learner
from sbcli.methods.base import balance_epochs
from sbcli.methods.memory import class_quotas


@dataclass(frozen=True)
class AddTaskOptions:
    """What `sb add-task` may change about how a step is learned and recorded."""

    epochs: int | None = None
    method: str | None = None
    data_roots: list[Path] = field(default_factory=list)  # where moved test sets of earlier tasks now are
    test_sample: bool = True  # carry a sample of the new classes' test images
    no_rehearsal: bool = False  # grow without exemplars of the old classes (a learner pulled without memory)
    balance_epochs: int | None = None  # class-balanced fine-tuning after this step and later ones (recorded); None: as recorded
    name: str | None = None  # what the new data is called on the card (default: the folder above train/test)


def set_balance(learner: Learner, epochs: int | None) -> None:
    """`sb add-task --balance-epochs E`: record E for this step and later ones; refused below 0 and under BiC."""
    if epochs is None:
        return
    if epochs < 0:
        raise ConfigError(f"--balance-epochs {epochs} is negative; give 0 (no balancing) or more.")
    epochs = balance_epochs(learner.state.method, learner.state.method_config, epochs, asked=True)
    learner.state.train_config = dataclasses.replace(learner.state.train_config, balance_epochs=epochs)


def check_rehearsal(learner: Learner, where: Path, no_rehearsal: bool) -> None:
    """Refuse to grow a learner whose memory lacks exemplars of classes it should rehearse (a push
    without --with-memory), unless the user asked for distillation alone."""
    if no_rehearsal or learner.state.steps == 0:
        return
    quotas = class_quotas(learner.memory.budget, learner.state.num_classes)
    held = learner.memory.per_class_counts()
    missing = [c for c, q in enumerate(quotas) if q > 0 and held.get(c, 0) == 0]
    if missing:
        raise LearnerError(f"The learner at {where} holds no exemplars of {len(missing)} of its {learner.state.num_classes} "
                           "classes (it was pushed or pulled without its memory), so add-task could not rehearse them; "
                           "pass --no-rehearsal to grow it by distillation alone, or pull a push made with --with-memory.")


PUBLISHED_FILES = ("README.md", "model.onnx")


def published_files(learner_dir: Path) -> list[str]:
    """The card and ONNX file that an export or pull left in the learner directory."""
    return [name for name in PUBLISHED_FILES if (Path(learner_dir) / name).is_file()]


def published_notes(learner_dir: Path, before: list[str], step: int) -> list[str]:
    """What became of the card and ONNX file of the previous step, in one sentence each."""
    notes = []
    for name in before:
        fate = "is now stale (it still describes" if (Path(learner_dir) / name).is_file() else "was removed (it described"
        redo = (f"`sb export {learner_dir} --to-hub REPO` pushes the card of step {step}" if name == "README.md"
                else f"`sb export {learner_dir} --format onnx -o model.onnx` writes step {step} outside the learner")
        notes.append(f"{name} in {learner_dir} {fate} step {step - 1}); {redo}.")
    return notes
