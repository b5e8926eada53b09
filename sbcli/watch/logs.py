"""Experiment logs where users already look, as watchers: TensorBoard event files and MLflow runs (optional extras).

Each log opens when the run starts (its input checked), records the settings the run starts with
(``start.options``) once, then per epoch ``epoch/loss``, ``epoch/lr`` and ``epoch/images_per_s`` (x: the
epoch's index over the whole run, every phase and step in turn, counting on from the epochs the
learner trained before, ``start.epochs_before``) and per step ``step/accuracy``, ``step/old``,
``step/new``, ``step/intra_old``, ``step/intra_new``, ``step/task_J`` and ``step/seconds`` (x: the step
number); a metric without a value (intra-old at step 1) is left out. It closes when the run ends.

- ``tensorboard`` (extra ``tensorboard``): ``torch.utils.tensorboard`` event files in
  ``<parent of the learner>/tensorboard/<learner name>/``, outside the learner directory because
  a save replaces that directory whole. ``tensorboard --logdir runs/tensorboard`` shows every run.
- ``mlflow`` (extra ``mlflow``): a run in experiment ``sbcli`` (or ``MLFLOW_EXPERIMENT_NAME``) of
  ``MLFLOW_TRACKING_URI``, else of a local file store ``./mlruns`` (MLflow 3 keeps file stores in
  maintenance mode; sbcli opts in with ``MLFLOW_ALLOW_FILE_STORE`` for that default alone).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from sbcli.errors import ConfigError
from sbcli.watch.watcher import Callbacks, Watcher

KINDS = {"tensorboard": "tensorboard", "mlflow": "mlflow"}  # --log value -> module that must be importable


def step_values(summary: Any) -> dict[str, float]:
    """The per-step metrics of a :class:`sbcli.run.steps.StepSummary` under their log names (no NaN)."""
    m = summary.metrics
    values = {"step/accuracy": m.overall, "step/old": m.old, "step/new": m.new, "step/intra_old": m.intra_old,
              "step/intra_new": m.intra_new, "step/seconds": summary.seconds,
              **{f"step/task_{j + 1}": v for j, v in enumerate(m.per_task)}}
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}


def epoch_values(event: Any) -> dict[str, float]:
    """The per-epoch numbers of a :class:`sbcli.watch.watcher.ProgressEvent` under their log names (no NaN)."""
    values = {"epoch/loss": event.loss, "epoch/lr": event.lr, "epoch/images_per_s": event.images_per_s}
    return {k: float(v) for k, v in values.items() if math.isfinite(v)}


def flatten(options: dict, prefix: str = "") -> dict[str, str]:
    """``{"run": {"train": {"lr": 0.1}}}`` -> ``{"run.train.lr": "0.1"}`` (lists as JSON)."""
    flat: dict[str, str] = {}
    for key, value in options.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value if isinstance(value, str) else json.dumps(value)
    return flat


class TensorBoardWatcher(Callbacks):
    """Scalars and the settings (as text) through ``torch.utils.tensorboard.SummaryWriter``."""

    def __init__(self, out: Path) -> None:
        self.directory = Path(out).parent / "tensorboard" / Path(out).name
        self.writer: Any = None  # opened when the run starts
        self.epochs = 0

    def on_start(self, start: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(self.directory))
        self.epochs = start.epochs_before
        rows = "\n".join(f"| {k} | {v} |" for k, v in flatten(start.options).items())
        self.writer.add_text("options", "| option | value |\n|---|---|\n" + rows)

    def on_epoch(self, event: Any) -> None:
        if self.writer is None:
            return
        self.epochs += 1
        for name, value in epoch_values(event).items():
            self.writer.add_scalar(name, value, self.epochs)

    def on_step(self, summary: Any) -> None:
        if self.writer is None:
            return
        for name, value in step_values(summary).items():
            self.writer.add_scalar(name, value, summary.step)
        self.writer.flush()

    def on_end(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class MlflowWatcher(Callbacks):
    """Params and metrics through ``mlflow.MlflowClient`` (no global active run)."""

    def __init__(self, out: Path) -> None:
        self.run_name = Path(out).name
        self.client: Any = None  # the run is created when the run starts
        self.run_id = ""
        self.epochs = 0

    def on_start(self, start: Any) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (Path.cwd() / "mlruns").as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # the documented default store, see module docstring
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "sbcli")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=self.run_name).info.run_id
        params = [Param(k, v[:6000]) for k, v in flatten(start.options).items()]
        for first in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[first : first + 100])
        self.epochs = start.epochs_before

    def _log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def on_epoch(self, event: Any) -> None:
        if self.client is None:
            return
        self.epochs += 1
        self._log(epoch_values(event), self.epochs)

    def on_step(self, summary: Any) -> None:
        if self.client is not None:
            self._log(step_values(summary), summary.step)

    def on_end(self) -> None:
        if self.client is not None:
            self.client.set_terminated(self.run_id)
            self.client = None


def check_kinds(kinds: list[str]) -> None:
    """Refuse an unknown ``--log`` value or a missing extra before any work starts.

    Raises:
        ConfigError: the name is unknown or its library is not installed.
    """
    for kind in kinds:
        if kind not in KINDS:
            raise ConfigError(f"--log {kind} is unknown; choose one of {', '.join(KINDS)}.")
        if importlib.util.find_spec(KINDS[kind]) is None:
            raise ConfigError(f"--log {kind} needs the {kind} extra: pip install \"sbcli[{kind}]\".")


def log_watchers(kinds: list[str], out: Path) -> list[Watcher]:
    """One log watcher per kind for the learner written to ``out`` (see the module docstring for where).

    Raises:
        ConfigError: a kind is unknown or its library is not installed.
    """
    check_kinds(kinds)
    made = {"tensorboard": TensorBoardWatcher, "mlflow": MlflowWatcher}
    return [made[kind](Path(out)) for kind in dict.fromkeys(kinds)]
