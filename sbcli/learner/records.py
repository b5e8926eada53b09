"""The records ``learner.json`` keeps, typed: a step and its metrics, a task, the memory and test-sample
settings, the provenance.

Each record's ``to_json`` writes exactly the JSON object sbcli has always written for it (the same keys,
in the same order, an absent optional key still absent), and ``from_json`` reads every format sbcli
reads, so a learner loaded and saved again keeps its bytes. ``from_json`` takes JSON that
:mod:`sbcli.learner.validate.learner_json` has checked (required keys present, of their type): it does not
check again. What a record does not know (a key a newer sbcli wrote, a method's own ``record``, a data
source record) is kept as the dict it was, and written back where it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sbcli.data.source_records import SourceRecord
from sbcli.engine.loop import PhaseReport
from sbcli.learner.test_sample import DEFAULT_CAP, CarriedSample
from sbcli.metrics import StepMetrics

STEP_KEYS = ("step", "num_classes", "metrics", "network_metrics", "phases", "record", "seconds", "train_config",
             "known_images", "forgotten")


@dataclass(frozen=True)
class StepRecord:
    """One learned step: its metrics under the learner's inference rule (and under the network's own output,
    where the rule scores with more than it), the phases it ran (each a ``PhaseReport.to_json``), the
    method's own record, how long it took and the engine settings it ran with.

    ``seconds`` and ``train_config`` are None in a learner written before sbcli recorded them;
    ``known_images`` is the number of images of classes learned at earlier steps that the step added (None,
    and not written, where it added none: every learner written before such steps were possible);
    ``extra`` holds the keys this sbcli does not know, in their order.
    """

    step: int
    num_classes: int
    metrics: StepMetrics
    network_metrics: StepMetrics | None = None
    phases: list[dict[str, Any]] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)  # the method's own (e.g. S&B's partition, after_B, after_C)
    seconds: float | None = None
    train_config: dict[str, Any] | None = None  # this step's own engine settings, as recorded (TrainConfig's asdict)
    extra: dict[str, Any] = field(default_factory=dict)
    known_images: int | None = None  # images of already-learned classes the step added (None: none)
    forgotten: list[str] | None = None  # the classes the step took out (`sb forget`; None: none)

    @property
    def phase_reports(self) -> list[PhaseReport]:
        """The phases the step ran, typed (``phases`` keeps them as ``learner.json`` holds them)."""
        return [PhaseReport.from_json(p) for p in self.phases]

    @property
    def epochs_trained(self) -> int:
        """Epochs the step did train, all its phases together."""
        return sum(p.epochs for p in self.phase_reports)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "num_classes": self.num_classes, "metrics": self.metrics.to_json()}
        if self.network_metrics is not None:
            out["network_metrics"] = self.network_metrics.to_json()
        out.update(phases=self.phases, record=self.record)
        if self.seconds is not None:
            out["seconds"] = self.seconds
        if self.train_config is not None:
            out["train_config"] = self.train_config
        if self.known_images is not None:
            out["known_images"] = self.known_images
        if self.forgotten is not None:
            out["forgotten"] = self.forgotten
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRecord:
        network = data.get("network_metrics")
        return cls(step=data["step"], num_classes=data["num_classes"], metrics=StepMetrics.from_json(data["metrics"]),
                   network_metrics=None if network is None else StepMetrics.from_json(network),
                   phases=data.get("phases", []), record=data.get("record", {}), seconds=data.get("seconds"),
                   train_config=data.get("train_config"), extra=_unknown(data, STEP_KEYS),
                   known_images=data.get("known_images"), forgotten=data.get("forgotten"))


@dataclass(frozen=True)
class TaskRecord:
    """One task: the class names it brought and the data ``source`` they came from (a record of
    :mod:`sbcli.data.source_records`, or a format-1 spec with paths; kept as its JSON object)."""

    classes: list[str]
    source: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def data_source(self) -> SourceRecord:
        """``source`` typed."""
        return SourceRecord.from_json(self.source)

    def to_json(self) -> dict[str, Any]:
        return {"classes": self.classes, "source": self.source, **self.extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskRecord:
        return cls(data["classes"], data["source"], _unknown(data, ("classes", "source")))


@dataclass(frozen=True)
class SequencePlan:
    """What a learner trained as a whole sequence (`sb train`) keeps for ``--resume``: its data source's record
    and its scenario (``{"order": [...], "sizes": [...]}``: :class:`sbcli.data.scenario.Scenario`'s JSON)."""

    source: dict[str, Any]
    scenario: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def data_source(self) -> SourceRecord:
        """``source`` typed."""
        return SourceRecord.from_json(self.source)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "scenario": self.scenario, **self.extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SequencePlan:
        return cls(data["source"], data["scenario"], _unknown(data, ("source", "scenario")))


@dataclass(frozen=True)
class MemorySettings:
    """The exemplar memory's settings: its budget (images in all), how exemplars are chosen, the seed."""

    budget: int
    selection: str = "random"
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"budget": self.budget, "selection": self.selection, "seed": self.seed}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemorySettings:
        return cls(**data)


@dataclass(frozen=True)
class TestSampleSettings:
    """What ``learner.json`` keeps about the carried test sample (:mod:`sbcli.learner.test_sample`): the cap
    (images per class at most), the images per class in the file, the 1-based steps whose owner declined."""

    __test__ = False  # not a pytest class, whatever its name

    cap: int = DEFAULT_CAP
    counts: list[int] = field(default_factory=list)
    declined_tasks: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, sample: CarriedSample, num_classes: int, cap: int, declined: list[int]) -> TestSampleSettings:
        """What ``learner.json`` keeps about ``sample``, carried by a learner of ``num_classes`` classes."""
        return cls(cap, sample.counts(num_classes), sorted(declined))

    def to_json(self) -> dict[str, Any]:
        return {"cap": self.cap, "counts": self.counts, "declined_tasks": self.declined_tasks}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TestSampleSettings | None:
        """The settings, or None for ``{}`` (a learner that carries no sample)."""
        return cls(**data) if data else None


PRETRAINED_KEYS = ("source", "name", "repo", "revision", "commit", "file", "sha256", "arch", "width", "classes", "steps",
                   "input_size", "package", "version")


@dataclass(frozen=True)
class PretrainedRecord:
    """What a learner records of the pretrained backbone it started from (``provenance.pretrained``), typed.

    ``source`` says where the weights came from: ``hub`` (``repo``, ``revision``, ``commit``, ``file``), ``file``
    or ``learner`` (by ``name``, never a path; a learner's ``width``, ``classes`` and ``steps``), ``package`` (a
    weight package: ``name``, ``package``, ``version``, ``file``), or ``random`` (none, asked for on purpose).
    ``sha256`` is the weights' hash, ``arch`` the architecture they were loaded on, ``input_size`` the square
    resolution they were trained at where it is known. A field None is one the record does not hold; ``extra``
    keeps keys this sbcli does not know, and ``order`` the order the keys were written in, so that
    ``to_json`` gives back the object it was read from.
    """

    source: str
    name: str | None = None
    repo: str | None = None
    revision: str | None = None
    commit: str | None = None
    file: str | None = None
    sha256: str | None = None
    arch: str | None = None
    width: float | None = None
    classes: int | None = None
    steps: int | None = None
    input_size: int | None = None
    package: str | None = None
    version: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def origin(self) -> str:
        """How a message names the weights: their name, else their repository, else where they came from."""
        return self.name or self.repo or self.source

    def to_json(self) -> dict[str, Any]:
        known = {k: getattr(self, k) for k in PRETRAINED_KEYS if getattr(self, k) is not None}
        data = {**known, **self.extra}
        first = [k for k in self.order if k in data]
        return {k: data[k] for k in [*first, *(k for k in data if k not in first)]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PretrainedRecord:
        return cls(**{k: data[k] for k in PRETRAINED_KEYS if k in data}, extra=_unknown(data, PRETRAINED_KEYS),
                   order=tuple(data))


PROVENANCE_KEYS = ("dataset", "sbcli_version", "torch_version", "python", "pretrained")


@dataclass(frozen=True)
class Provenance:
    """Where the learner came from: the dataset it started on, the sbcli, torch and Python versions that
    started it, and its pretrained backbone's record (``{"source": "random"}`` when asked for none).

    A field None is one the learner does not record; ``extra`` keeps keys this sbcli does not know.
    """

    dataset: str | None = None
    sbcli_version: str | None = None
    torch_version: str | None = None
    python: str | None = None
    pretrained: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def backbone(self) -> PretrainedRecord | None:
        """The pretrained backbone's record, typed (None: the learner records none)."""
        return None if self.pretrained is None else PretrainedRecord.from_json(self.pretrained)

    def to_json(self) -> dict[str, Any]:
        known = {k: getattr(self, k) for k in PROVENANCE_KEYS if getattr(self, k) is not None}
        return {**known, **self.extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Provenance:
        return cls(**{k: data[k] for k in PROVENANCE_KEYS if k in data}, extra=_unknown(data, PROVENANCE_KEYS))


def _unknown(data: dict[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in known}
