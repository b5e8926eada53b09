"""The Python face of sbcli: one function per command, so a notebook can do what the terminal does.

Nothing here renders; progress reaches the caller through watchers (:mod:`sbcli.watch.watcher`: a run
tells each of a list every event), results through return values.
Each function checks what it is given and hands the work to the module whose one job it is: the
task sequence to :mod:`sbcli.run.sequence`, a new task to :mod:`sbcli.run.add_task`, evaluation to
:mod:`sbcli.run.evaluation`, rollback to :mod:`sbcli.learner.rollback`, and the ways out (ONNX,
Triton, the Hub, the zoo, prediction) to :mod:`sbcli.api.shipping`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sbcli.api.shipping import export_int8, export_onnx, export_triton, predict, pull, push, zoo
from sbcli.config.options import RunOptions, SequenceOptions, build_options, known_keys
from sbcli.engine.hardware import resolve_device
from sbcli.engine.distributed import is_main_process, session
from sbcli.errors import ConfigError
from sbcli.learner import rollback as rollbacks
from sbcli.learner.records import MemorySettings, Provenance, StepRecord, TaskRecord, TestSampleSettings
from sbcli.learner.state import Learner, LearnerState, read_state
from sbcli.methods import METHODS
from sbcli.methods.ridge_forget import ForgetRecord
from sbcli.methods.split_bridge import SplitBridgeRecord
from sbcli.nets import list_models
from sbcli.run import add_task as adding
from sbcli.run import evaluation, sequence
from sbcli.run import forget as forgetting
from sbcli.metrics import StepMetrics, Summary
from sbcli.run.add_task import AddTaskOptions
from sbcli.run.evalsets import TaskTestData, TestDataReport
from sbcli.run.evaluation import Evaluation
from sbcli.run.sequence import StepFn, save_from_main, sequence_scenario
from sbcli.run.steps import StepSummary
from sbcli.watch.watcher import WatcherLike

ProgressFn = WatcherLike  # watchers (sbcli.watch.watcher.Watcher), a function of each epoch's event, or a list of either

__all__ = [
    "AddTaskOptions", "Evaluation", "ForgetRecord", "Learner", "LearnerState", "MemorySettings", "ProgressFn", "Provenance", "RunOptions",
    "SequenceOptions", "SplitBridgeRecord", "StepFn", "StepMetrics", "StepRecord", "StepSummary", "Summary", "TaskRecord", "TaskTestData",
    "TestDataReport", "TestSampleSettings", "add_task",
    "architectures", "evaluate", "forget", "export_int8", "export_onnx", "export_triton", "is_main_process", "learner_state",
    "method_summaries", "options", "predict", "pull", "push", "resolve_device", "rollback", "save_from_main",
    "sequence_scenario", "session", "train", "zoo",
]


def options(source: str | None = None, *, recipe: str | None = None, **settings: Any) -> tuple[SequenceOptions, RunOptions]:
    """The sequence and run that ``sb train SOURCE [--recipe RECIPE] [--SETTING VALUE ...]`` would use.

    The same per-source defaults, recipes and names as the CLI (:mod:`sbcli.config.options`), e.g.
    ``options("cifar100", recipe="paper-10", epochs=3, weight_decay=1e-4)``.

    Raises:
        ConfigError: a setting that no run takes, or a value that is refused.
    """
    unknown = sorted(set(settings) - known_keys())
    if unknown:
        raise ConfigError(f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a setting of a run; "
                          f"known: {', '.join(sorted(known_keys()))}.")
    seq, run, _ = build_options({"source": source, "recipe": recipe, **settings})
    return seq, run


def train(seq: SequenceOptions, run: RunOptions, out: Path, *, resume: bool = False, keep: int | None = None,
          on_progress: ProgressFn | None = None, on_step: StepFn | None = None) -> Learner:
    """Learn a whole task sequence, saving the learner to ``out`` after every step.

    With ``resume``, continue the sequence stored at ``out`` from its last completed step. ``keep``:
    keep only the last N steps' files (default: every step). ``out`` is locked for the whole run.
    """
    return sequence.train(seq, run, out, resume=resume, keep=keep, on_progress=on_progress, on_step=on_step)


def add_task(learner_dir: Path, folder: Path, test: Path | None = None, *, device: str = "auto",
             keep: int | None = None, options: AddTaskOptions | None = None,
             on_progress: ProgressFn | None = None) -> StepSummary:
    """Learn the classes of ``folder`` (class-per-folder) as a new task of the learner at ``learner_dir``.

    Everything is checked before training; the learner on disk changes only when the step is done.
    ``options`` (:class:`AddTaskOptions`) change how the step is learned: ``epochs`` and ``warmup_epochs``
    from here on; ``method``, when given, must be the learner's own (a learner keeps the method it started with).
    The learner is locked against other writers from the start. ``keep``: keep only the last N steps.
    The returned summary's ``notes`` say which test images measured the old classes and what
    became of a card or ONNX file that described the previous step; its ``state`` is the learner as saved.
    """
    return adding.add_task(learner_dir, folder, test, device=device, keep=keep, options=options,
                           on_progress=on_progress)


def learner_state(learner_dir: Path, step: int | None = None) -> LearnerState:
    """The state of the learner at ``learner_dir`` (at kept step ``step``), every file checked first.

    Raises:
        LearnerError: not a learner, or a file is missing or malformed.
    """
    return read_state(Path(learner_dir), step)


def evaluate(learner_dir: Path, folder: Path | None = None, *, device: str = "auto", step: int | None = None,
             data_roots: list[Path] | None = None) -> Evaluation:
    """Accuracy of the learner now, or at kept step ``step`` (on ``folder``, else on each task's
    original test set when it is here and unchanged, else on the carried test sample) plus its
    history, summary and ``test_data`` (which images were used, per task).

    The :class:`Evaluation`'s fields are what ``sb evaluate`` shows; its ``to_json()`` is ``sb evaluate --json``."""
    return evaluation.evaluate(learner_dir, folder, device=device, step=step, data_roots=data_roots)


def rollback(learner_dir: Path, step: int) -> dict:
    """Make kept step ``step`` of the learner current again; later kept steps stay until the next save.

    Raises:
        LearnerError: the step is not kept (nothing changes), or another writer holds the learner.
    """
    return rollbacks.rollback(learner_dir, step)


def forget(learner_dir: Path, classes: list[str], data: Path | None = None, *, device: str = "auto",
           keep: int | None = None) -> StepSummary:
    """Take ``classes`` out of the learner at ``learner_dir`` as a new step (``sb forget``).

    A ridge or LDA head on a frozen backbone (``--method ranpac``): with ``data``, the classes' training
    images (one folder per class, exactly those it was taught), their terms leave the head's sums and the
    learner equals one never taught them, to float64's rounding; without, the classes leave the head alone.
    Everything is checked before an image is decoded; ``sb rollback`` undoes the step.

    Raises:
        ConfigError: no class, an unknown class, every class, or a method whose classes cannot be taken out.
        DataError: ``data`` that is not the training images of exactly those classes.
    """
    return forgetting.forget(learner_dir, classes, data, device=device, keep=keep)


def method_summaries() -> dict[str, str]:
    """Each registered method's name and its one-line summary, in registration order (``sb methods``)."""
    return {name: METHODS.get(name).summary for name in METHODS.names()}


def architectures() -> list[str]:
    """The names ``--arch`` takes (sbcli's own networks; ``timm/NAME`` besides)."""
    return list_models()
