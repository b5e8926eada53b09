"""The persisted learner: a directory readable without unpickling anything.

| file | holds |
|---|---|
| ``learner.json`` | the commit point: format version, network, input size, normalisation, classes and their tasks, method and hyperparameters, partition, history, provenance, and the files of every kept step |
| ``steps/NNNN/model.safetensors`` | network weights after step NNNN (head sized to the classes seen) plus method state (e.g. NME class means) |
| ``steps/NNNN/memory.safetensors`` | exemplar images (uint8, training resolution) and their labels |
| ``steps/NNNN/test-sample.safetensors`` | the carried test sample: held-out test images of every class (``sbcli.learner.test_sample``) |
| ``steps/NNNN/state.json`` | the state at that step (for ``--step N`` and ``sb rollback``) |
| ``objects/<sha256>`` | blocks of the large tensors of the files above, each stored once for every step naming it |

Saves go through :mod:`sbcli.learner.store.commit` (new files under new names, fsync, one rename of
``learner.json``), so a crash leaves the previous learner or the new one, never a mix; loads read
``learner.json`` once and then only the immutable files it names. Format 1 (files at the root) is
still read.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save as safetensors_bytes

from sbcli.data.device import Normalization
from sbcli.engine.loop import TrainConfig
from sbcli.errors import LearnerError
from sbcli.jsonutil import config_from_json
from sbcli.learner import test_sample as carried_sample
from sbcli.learner import validate
from sbcli.learner.records import MemorySettings, Provenance, SequencePlan, StepRecord, TaskRecord, TestSampleSettings
from sbcli.learner.store import legacy, objects
from sbcli.learner.store.commit import commit_step, write_flat
from sbcli.learner.store.layout import FORMAT_VERSION, Stored, read_step, read_stored
from sbcli.learner.test_sample import CarriedSample
from sbcli.learner.validate.tensors import EXTRA_PREFIX
from sbcli.methods.base import MethodConfig
from sbcli.methods.memory import ExemplarMemory
from sbcli.nets import create_model
from sbcli.nets.resnet import IncrementalResNet


@dataclass
class LearnerState:
    """The JSON half of a learner (everything but tensors), typed where a run reads it.

    ``method_config`` is the method's ``Config`` and ``train_config`` the engine's
    :class:`TrainConfig`; the history, tasks, memory, test-sample settings and provenance are the records of
    :mod:`sbcli.learner.records`. :meth:`to_json` and :meth:`from_json` are the one way between this and
    ``learner.json``.
    """

    arch: str
    width: float
    image_size: int
    normalization: dict
    method: str
    method_config: MethodConfig  # the method's own Config (sbcli.methods)
    train_config: TrainConfig
    memory: MemorySettings
    seed: int
    class_names: list[str] = field(default_factory=list)
    class_task: list[int] = field(default_factory=list)
    tasks: list[TaskRecord] = field(default_factory=list)  # per step: classes and their source
    history: list[StepRecord] = field(default_factory=list)  # per step: metrics, phases, the method's record
    plan: SequencePlan | None = None  # a whole sequence: source and scenario, for --resume
    provenance: Provenance = field(default_factory=Provenance)
    test_sample: TestSampleSettings | None = None  # the carried test sample (None: none; ``{}`` in learner.json)
    format_version: int = FORMAT_VERSION

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def norm(self) -> Normalization:
        """The normalisation, typed (``normalization`` keeps it as ``learner.json`` holds it)."""
        return Normalization.from_json(self.normalization)

    def to_json(self) -> dict[str, Any]:
        """The object ``learner.json`` (and each step's ``state.json``) holds."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data.update(method_config=dataclasses.asdict(self.method_config), train_config=dataclasses.asdict(self.train_config),
                    memory=self.memory.to_json(), tasks=[t.to_json() for t in self.tasks],
                    history=[h.to_json() for h in self.history], provenance=self.provenance.to_json(),
                    plan=None if self.plan is None else self.plan.to_json(),
                    test_sample={} if self.test_sample is None else self.test_sample.to_json())
        return copy.deepcopy(data)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LearnerState:
        """The state of a checked ``learner.json`` object, of any format this version reads.

        A setting that an older learner does not record takes the value the dataclass gives it
        (the ``value`` column of :data:`sbcli.defaults.DEFAULTS`: the paper's, which is what the
        engine did before the setting existed); lists come back as the tuples they were.

        Raises:
            TypeError: a field the state does not have (the caller says the file is damaged).
            ConfigError: a method setting its method refuses.
        """
        from sbcli.methods import METHODS

        typed = {**data, "train_config": config_from_json(TrainConfig, data["train_config"]),
                 "method_config": config_from_json(METHODS.get(data["method"]).config, data["method_config"]),
                 "memory": MemorySettings.from_json(data["memory"]),
                 "tasks": [TaskRecord.from_json(t) for t in data.get("tasks", [])],
                 "history": [StepRecord.from_json(h) for h in data.get("history", [])],
                 "provenance": Provenance.from_json(data.get("provenance", {})),
                 "plan": None if data.get("plan") is None else SequencePlan.from_json(data["plan"]),
                 "test_sample": TestSampleSettings.from_json(data.get("test_sample", {}))}
        return cls(**typed)

    @property
    def steps(self) -> int:
        return len(self.history)

    def require_classes(self, doing: str) -> None:
        """Refuse ``doing`` (evaluate, export, push) on a learner with no classes yet: one pulled as a backbone
        (``sb pull`` of a backbone entry) or rolled back to step 0.

        Raises:
            LearnerError: the learner has no classes.
        """
        if not self.class_names:
            raise LearnerError(f"This learner has no classes yet (a backbone waiting for its first task), so there is "
                               f"nothing to {doing}; add its first classes with `sb add-task LEARNER FOLDER`.")


@dataclass
class Learner:
    """A model, its exemplar memory and its state; see the module docstring for the format."""

    state: LearnerState
    model: IncrementalResNet
    memory: ExemplarMemory
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    test_sample: CarriedSample | None = None

    @property
    def norm(self) -> Normalization:
        return self.state.norm

    def save(self, path: Path, keep: int | None = None) -> None:
        """Commit the learner's current step to ``path`` (see :func:`sbcli.learner.store.commit.commit_step`).

        ``keep``: keep only the last N steps (default: the learner's stored setting, all for a new one).
        The caller holds the writer lock when ``path`` may have other writers.

        Raises:
            LearnerError: the save failed (a full disk, a permission); what was saved before is unchanged.
        """
        try:
            payload, blocks = self._payload()
            commit_step(Path(path), payload, self.state.to_json(), keep, blocks)
        except (OSError, SafetensorError) as err:  # safetensors reports a full disk as its own error
            reason = f"{err.strerror}: {err.filename}" if isinstance(err, OSError) and err.strerror else str(err)
            raise LearnerError(f"Could not save the learner to {path} ({reason}); what was saved there before is "
                               "unchanged: free some space or fix the permissions and run the command again.") from err

    def publish(self, folder: Path) -> None:
        """Write the current step alone into the new folder ``folder``, files at the root (for the Hub).

        Its files are whole (no blocks): a published ``model.safetensors`` is the network's weights as any
        safetensors reader (``--pretrained OWNER/NAME``, timm, a script) expects them.
        """
        payload, _ = self._payload(blocks=False)
        write_flat(Path(folder), payload, self.state.to_json())

    def _payload(self, blocks: bool = True) -> tuple[dict[str, bytes], dict[str, bytes]]:
        """The per-step files other than the state, as bytes (keys of ``sbcli.learner.store.layout.STEP_FILES``),
        and the content-addressed blocks they name (SHA-256 -> bytes: :mod:`sbcli.learner.store.objects`);
        ``blocks`` False: every tensor in its file, no block."""
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
        tensors.update({EXTRA_PREFIX + k: v.detach().cpu().contiguous() for k, v in self.extra.items()})
        images, labels = self.memory.tensors()
        files = {"model": tensors, "memory": {"images": images.contiguous(), "labels": labels.contiguous()}}
        if self.test_sample is not None:
            files["test_sample"] = self.test_sample.tensors()
        payload: dict[str, bytes] = {}
        named_blocks: dict[str, bytes] = {}
        for key, named in files.items():
            if not blocks:
                payload[key] = safetensors_bytes(named)
                continue
            cuts = {"images": objects.class_cuts(named["labels"])} if "labels" in named else None
            stored = objects.split(named, cuts)
            payload[key] = stored.data
            named_blocks.update(stored.blocks)
        return payload, named_blocks

    @classmethod
    def load(cls, path: Path, device: torch.device | str = "cpu", step: int | None = None, *,
             recover: bool = True) -> "Learner":
        """Read a learner directory (no pickle), at its current step or at kept step ``step``.

        The store reads and verifies the bytes (:func:`sbcli.learner.store.layout.read_step`); this parses
        them, checking every tensor before a network is built from it. A learner that an interrupted 0.1
        save left beside ``path`` is moved back first (:func:`sbcli.learner.store.legacy.recover`), unless
        ``recover`` is False: a writer passes False, since its lock did that already.

        Raises:
            LearnerError: no learner, a missing or malformed file, a newer format, or a step not kept.
        """
        path = Path(path)
        if recover:
            legacy.recover(path)
        read = read_step(path, step)
        state = _parse_state(read.state, read.where)
        tensors = read.tensors("model")  # bytes checked, parsed without trust
        validate.check_model_tensors(tensors, state, read.path("model"))  # before any network is built
        memory = ExemplarMemory(state.memory.budget, state.memory.selection, state.memory.seed)
        kept = read.tensors("memory")
        validate.check_memory_tensors(kept, state, read.path("memory"))
        if "images" not in kept or "labels" not in kept:
            raise LearnerError(f"{read.path('memory')} lacks images or labels; restore the learner from a copy.")
        if len(kept["labels"]):
            memory.images, memory.labels = kept["images"], kept["labels"].long()
        sample = None  # the carried test sample, checked against what learner.json records of it
        if state.test_sample is not None:
            if "test_sample" not in read.files:
                raise LearnerError(f"learner.json of {read.root} records a test sample but names no file for it; "
                                   "restore the learner from a copy.")
            sample = carried_sample.check(read.tensors("test_sample"),
                                          state.test_sample.counts, state.num_classes, state.image_size,
                                          read.path("test_sample"))
        model = create_model(state.arch, state.num_classes, state.width)
        extra = {k[len(EXTRA_PREFIX):]: v for k, v in tensors.items() if k.startswith(EXTRA_PREFIX)}
        try:
            model.load_state_dict({k: v for k, v in tensors.items() if not k.startswith(EXTRA_PREFIX)})
        except RuntimeError as err:
            raise LearnerError(f"{read.path('model')} does not match learner.json ({err.args[0].splitlines()[0]}); "
                               "the learner is corrupt, restore it from a copy.") from err
        return cls(state, model.to(device), memory, extra, sample)


def open_stored(path: Path, *, recover: bool = True) -> Stored:
    """``learner.json`` of ``path``, read once; a learner left beside it by an interrupted 0.1 save is moved back
    first, unless ``recover`` is False (a writer's lock has done it, or a check before the lock reads it where
    it lies)."""
    if recover:
        legacy.recover(path)
    return read_stored(path)


def read_state(path: Path, step: int | None = None, *, recover: bool = True) -> LearnerState:
    """Check a learner directory and parse its state (at kept step ``step``, default the current one;
    ``recover``: as :func:`open_stored`)."""
    stored = open_stored(Path(path), recover=recover)
    data, where = stored.checked_state(step)
    missing = [rel for rel in stored.step_files(step).values() if not (stored.root / rel).is_file()]
    if missing:
        raise LearnerError(f"The learner at {path} is missing {', '.join(missing)}; restore the directory from a copy.")
    return _parse_state(data, where)


def served_steps(path: Path) -> dict[int, dict[str, str]]:
    """The kept steps a model can be made of, with their files: not past the current step (a rollback leaves later
    ones kept), nor step 0 of a learner pulled as a backbone (no classes to score)."""
    stored = open_stored(Path(path))
    return {n: files for n, files in stored.kept.items() if 1 <= n <= stored.current}


def kept_steps(path: Path) -> list[int]:
    """The steps of the learner at ``path`` that ``--step`` and ``sb rollback`` can go back to."""
    return sorted(open_stored(Path(path)).kept)


def _parse_state(data: dict[str, Any], where: Path) -> LearnerState:
    """The typed state of a checked state JSON object."""
    try:
        return LearnerState.from_json(data)
    except TypeError as err:
        raise LearnerError(f"{where} has unexpected fields ({err}); restore it from a copy.") from err
