"""The one family of errors a user can trigger.

Library code raises a subclass of :class:`SbcliError` with one sentence that names the problem
and the fix; the CLI maps it to a message and a non-zero exit code (``cli/_errors.py``).
"""

from __future__ import annotations


class SbcliError(Exception):
    """Base class of every error that is the user's to fix."""


class DataError(SbcliError):
    """A data source is missing, empty, malformed or undecodable."""


class ConfigError(SbcliError):
    """Options that contradict each other or the learner (bad task split, unknown name, ...)."""


class LearnerError(SbcliError):
    """A learner directory that is missing files, from a newer format, or inconsistent."""


class TrainingError(SbcliError):
    """Training cannot go on (a loss that became NaN or infinite); nothing of the step is saved."""


class DeviceError(SbcliError):
    """A device was asked for that this machine does not have."""


class ExportError(SbcliError):
    """Export or serving failed (missing extra, parity check failed, Hub unreachable, ...)."""


class CommittedInterrupt(KeyboardInterrupt):
    """Ctrl-C after a save was committed: the learner holds the new step, only what follows the commit was
    stopped (removing files no step names any more, which the next writer does; the results files)."""

    def __init__(self, path: object, step: int) -> None:
        super().__init__(f"the step was already committed: the learner at {path} holds step {step}")
        self.path, self.step = path, step


class UnknownNameError(ConfigError):
    """A registry lookup with a name that is not registered."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        import difflib

        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        super().__init__(f"Unknown {kind} '{name}'; choose one of: {', '.join(sorted(known))}.{hint}")
        self.name = name
        self.known = known
