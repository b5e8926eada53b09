"""What a front end (the CLI, a notebook's own loop) needs around the API's calls, in one place.

Under torchrun every rank runs the command: :func:`is_main_process` says whether this one reports
and logs, and :func:`session` holds the process group around the call. Beside these: the progress
callbacks a watcher subclasses (:class:`Callbacks`, told a :class:`ProgressEvent` after each epoch),
experiment logs (TensorBoard, MLflow), the epochs a learner has trained, a history's summary, the
folder a run writes to when none is given, and the methods and architectures there are. Each has
its home below the API; a front end takes them from here.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

from sbcli.engine import distributed
from sbcli.engine.progress import Callbacks, ProgressEvent
from sbcli.methods import METHODS
from sbcli.metrics import history_summary
from sbcli.nets import list_models
from sbcli.run import loggers
from sbcli.run.plan import actual_epochs
from sbcli.run.rundirs import output_dir

__all__ = ["Callbacks", "ProgressEvent", "architectures", "check_log_kinds", "epochs_trained", "history_summary",
           "is_main_process", "method_summaries", "open_logs", "output_dir", "session"]


def is_main_process() -> bool:
    """Whether this process reports and logs: always outside torchrun, rank 0 alone under it."""
    return distributed.is_main_process()


def session(device: str = "auto") -> AbstractContextManager[None]:
    """The process group of a torchrun launch, joined around a command and left after it (nothing outside torchrun)."""
    return distributed.session(device)


def check_log_kinds(kinds: list[str]) -> None:
    """Refuse an unknown ``--log`` kind, or one whose package is not installed, before any work starts."""
    loggers.check_kinds(kinds)


def open_logs(kinds: list[str], out: Path, options: dict, epochs_before: int = 0) -> list[loggers.ExperimentLog]:
    """The experiment logs of ``kinds`` for a run writing to ``out``, its ``options`` recorded;
    epochs count on from ``epochs_before`` (a learner that trained before)."""
    return loggers.open_logs(kinds, out, options, epochs_before)


def epochs_trained(history: list[dict]) -> int:
    """Epochs the recorded steps did train, all their phases together."""
    return sum(actual_epochs(history))


def method_summaries() -> dict[str, str]:
    """Each registered method's name and its one-line summary, in registration order."""
    return {name: METHODS.get(name).summary for name in METHODS.names()}


def architectures() -> list[str]:
    """The names ``--arch`` takes (sbcli's own networks; ``timm/NAME`` besides)."""
    return list_models()
