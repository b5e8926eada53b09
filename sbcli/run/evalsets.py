"""Which test images evaluate a learner: each task's original test set when it is here and
unchanged, else the test sample the learner carries; and saying which was used.

For every task the learner recorded (``sbcli.data.source_records``), candidate places are tried in order:
each ``--data-root`` (the recorded folder name inside it, or the root itself), then where this
machine last saw a set with the recorded fingerprint (``sbcli.data.whereabouts``), then a
format-1 learner's own path, then a benchmark's default place. A candidate is used when its
fingerprint (class names, counts, content hash) is the recorded one; a set with the recorded
classes but other images is "changed" and the carried sample stands in. A ``--data-root`` that
no task recognises is refused before any work starts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from sbcli.data.catalog import open_spec, relabel
from sbcli.data.fingerprint import fingerprint
from sbcli.data.imageset import ImageSet
from sbcli.data.source_records import SourceRecord, test_fingerprint, test_name
from sbcli.data.whereabouts import recall
from sbcli.errors import DataError
from sbcli.learner.records import TaskRecord, TestSampleSettings
from sbcli.learner.test_sample import CarriedSample

DEFAULT_DATASETS = Path.home() / ".cache" / "sbcli" / "datasets"


@dataclass(frozen=True)
class TaskTestData:
    """Where one task's test images came from: ``folder`` (the original set), ``sample`` or ``none``."""

    task: int
    classes: list[str]
    used: str
    images: int
    detail: str

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TestDataReport:
    """Which test images an evaluation used: ``used`` is ``folder``, ``sample``, ``mixed`` or ``none``; ``tasks``
    says where each task's came from; ``folder`` is the test folder named instead of the learner's own sets."""

    __test__ = False  # not a pytest class, whatever its name

    used: str
    tasks: list[TaskTestData]
    folder: str | None = None

    @classmethod
    def of_folder(cls, folder: Path) -> TestDataReport:
        return cls("folder", [], str(folder))

    def to_json(self) -> dict:
        out: dict = {"used": self.used, "tasks": [t.to_json() for t in self.tasks]}
        return out if self.folder is None else {**out, "folder": self.folder}


@dataclass(frozen=True)
class EvalData:
    """The test images of every class (labels in the learner's order) and where each task's came from."""

    test: ImageSet
    tasks: list[TaskTestData]

    @property
    def used(self) -> str:
        """``folder``, ``sample``, ``mixed`` or ``none``: what the tasks with test images used."""
        kinds = {t.used for t in self.tasks if t.used != "none"}
        if not kinds:
            return "none"
        return kinds.pop() if len(kinds) == 1 else "mixed"

    def to_json(self) -> dict:
        return self.report().to_json()

    def report(self) -> TestDataReport:
        """Which test images were used: what ``sb evaluate --json`` says under ``test_data``."""
        return TestDataReport(self.used, self.tasks)

    def describe(self) -> str:
        """One line per task, for the terminal."""
        return "\n".join(f"Test images of task {t.task} ({', '.join(t.classes[:4])}{', ...' if len(t.classes) > 4 else ''}): "
                         f"{t.images} from {t.detail}." for t in self.tasks)


@dataclass
class _Found:
    """What one place holds, opened once and shared by the tasks that recorded the same set."""

    images: ImageSet | None
    where: str
    why: str = ""


@dataclass
class Finder:
    """Looks up recorded test sets on this machine; remembers what each data root matched."""

    data_roots: list[Path] = field(default_factory=list)
    matched_roots: set[Path] = field(default_factory=set)
    seen_in_roots: dict[Path, list[str]] = field(default_factory=dict)
    known: list[str] = field(default_factory=list)  # each recorded test set looked for, "'name': its classes"
    _opened: dict[tuple, _Found] = field(default_factory=dict)
    _hashes: dict[tuple, str] = field(default_factory=dict)

    def find(self, task: TaskRecord) -> _Found:
        """The test set ``task`` recorded, when found unchanged; else ``images=None`` and why."""
        record = task.source
        name, recorded = test_name(record), test_fingerprint(record)
        if name is None:
            return _Found(None, "", "no test folder was given when it was learned")
        classes = recorded.classes if recorded is not None else task.classes
        self.known.append(f"'{name}': {', '.join(classes[:4])}{', ...' if len(classes) > 4 else ''}")
        reasons: list[str] = []
        for spec, root in self._candidates(task.data_source, name, recorded):
            if not self._plausible(spec, root, recorded):
                continue
            images = self._open(spec)
            if images is None:
                continue
            if root is not None:
                self.seen_in_roots.setdefault(root, images.class_names)
            if recorded is None:  # a format-1 learner: no fingerprint to compare, trust its own path
                return _Found(images, _where(spec))
            if images.class_names != recorded.classes:
                continue
            if root is not None:
                self.matched_roots.add(root)
            if self._sha256(spec, images) == recorded.sha256:
                return _Found(images, _where(spec))
            reasons.append(f"'{name}' at {_where(spec)} changed since it was learned")
        return _Found(None, "", reasons[0] if reasons else f"the test set '{name}' was not found here")

    def _plausible(self, spec: dict, root: Path | None, recorded) -> bool:
        """Whether a class-per-folder candidate has the recorded class folders (checked before decoding)."""
        if spec["kind"] != "folder" or recorded is None:
            return True
        if not Path(spec["path"]).is_dir():
            return False
        folders = sorted(p.name for p in Path(spec["path"]).iterdir() if p.is_dir() and not p.name.startswith("."))
        if root is not None and folders:
            self.seen_in_roots.setdefault(root, folders)
        return folders == sorted(recorded.classes)

    def _sha256(self, spec: dict, images: ImageSet) -> str:
        """The content hash of what ``spec`` holds, computed once (a benchmark's tasks share one test set)."""
        key = _key(spec)
        if key not in self._hashes:
            self._hashes[key] = fingerprint(images).sha256
        return self._hashes[key]

    def _open(self, spec: dict) -> ImageSet | None:
        key = _key(spec)
        if key not in self._opened:
            try:
                opened = open_spec(spec, train=spec["kind"] == "folder", test=spec["kind"] != "folder")
                images = opened.train if spec["kind"] == "folder" else opened.test
                self._opened[key] = _Found(images, _where(spec))
            except DataError as err:  # not there or not readable: the next candidate is tried
                self._opened[key] = _Found(None, _where(spec), str(err))
        return self._opened[key].images

    def _candidates(self, source: SourceRecord, name: str, recorded) -> list[tuple[dict, Path | None]]:
        kind, size = source.kind, source.image_size
        places: list[tuple[Path, Path | None]] = []
        for root in self.data_roots:
            places += [(root / name, root), (root, root)]
        if recorded is not None and (seen := recall(recorded.sha256)) is not None:
            places.append((seen, None))
        if source.legacy_path:
            places.append((Path(source.legacy_path), None))
        if kind in ("cifar10", "cifar100"):
            places.append((DEFAULT_DATASETS, None))
        if kind == "demo":
            return [({"kind": "demo"}, None)]
        out = []
        for path, root in places:
            if not path.exists():
                continue
            if kind == "folder":
                out.append(({"kind": "folder", "path": str(path), "image_size": size or 32}, root))
            elif kind == "tiny-imagenet":
                out.append(({"kind": kind, "path": str(path)}, root))
            else:
                out.append(({"kind": kind, "root": str(path), "download": False}, root))
        return out

    def check_roots(self) -> None:
        """Refuse a data root that none of the learner's test sets was recognised in."""
        known = list(dict.fromkeys(self.known))
        for root in self.data_roots:
            if root in self.matched_roots:
                continue
            held = self.seen_in_roots.get(root)
            what = (f"holds other classes ({', '.join(held[:6])}) than the learner's test sets" if held
                    else "holds none of the learner's test sets")
            raise DataError(f"--data-root {root} {what} ({'; '.join(known)}); point it at the folder that holds the "
                            "original test folders, or drop it to use the carried test sample.")


def _key(spec: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in spec.items()))


def _where(spec: dict) -> str:
    return spec.get("path") or spec.get("root") or "the bundled demo"


def choose(state, sample: CarriedSample | None, data_roots: list[Path] | None = None) -> EvalData:
    """The evaluation images of every task the learner state ``state`` recorded.

    Raises:
        DataError: a ``--data-root`` that none of the tasks' test sets was found in.
    """
    finder = Finder([Path(r).expanduser().resolve() for r in data_roots or []])
    declined = set(state.test_sample.declined_tasks) if state.test_sample is not None else set()
    parts: list[ImageSet] = []
    report: list[TaskTestData] = []
    for step, task in enumerate(state.tasks):
        classes = [c for c in task.classes if c in state.class_names]  # less those a later step took out
        if not classes:  # a step of known classes' images alone, or of classes taken out: nothing of its own
            continue
        found = finder.find(task)
        if found.images is not None:
            images = _resized(found.images, task.data_source)  # a benchmark's at the resolution the learner trained at
            part = relabel(images, state.class_names, classes)
            report.append(TaskTestData(step + 1, classes, "folder", len(part), f"the test set at {found.where}"))
            parts.append(part)
            continue
        ids = [i for i, t in enumerate(state.class_task) if t == step]
        part = sample.of_classes(ids, state.class_names) if sample is not None else None
        if part is not None and len(part):
            report.append(TaskTestData(step + 1, classes, "sample", len(part), f"the carried test sample ({found.why})"))
            parts.append(part)
            continue
        lack = ("its owner kept them out of the learner (--no-test-sample)" if step + 1 in declined
                else "the learner carries no test sample of these classes")
        report.append(TaskTestData(step + 1, classes, "none", 0, f"nowhere: {found.why} and {lack}"))
    finder.check_roots()
    return EvalData(ImageSet.joined(parts, state.class_names), report)


def _resized(images: ImageSet, source: SourceRecord) -> ImageSet:
    """A benchmark's test images at the resolution the learner was trained at."""
    from sbcli.data.catalog import Opened
    from sbcli.data.shaping import resize_opened

    spec = {"kind": source.kind, **({"image_size": source.image_size} if source.image_size is not None else {})}
    return resize_opened(Opened(images, images, None), spec).test


def test_data(learner, data_roots: list[Path] | None = None, required: Path | None = None) -> EvalData:
    """The test images of every class a learner knows: each task's original test set when it is here
    and unchanged, else its carried test sample.

    Raises:
        DataError: a ``--data-root`` none of its test sets is in; with ``required`` (the learner's
            directory), also when there are no test images at all.
    """
    chosen = choose(learner.state, learner.test_sample, data_roots)
    if required is not None and len(chosen.test) == 0:
        raise DataError(f"The learner at {required} has no test images to evaluate on (none of its test sets is "
                        "here and it carries no test sample); give a class-per-folder test directory.")
    return chosen


def load_test_sets(learner) -> ImageSet:
    """The test images :func:`test_data` chooses, without the report of where they came from."""
    return test_data(learner).test


def carry(learner, test: ImageSet, new_ids: list[int], keep: bool) -> None:
    """Add the test images of the new classes ``new_ids`` to the learner's carried sample (capped per
    class), or record that this task's owner declined (``keep`` False: ``--no-test-sample``)."""
    from sbcli.learner import test_sample as cs

    state = learner.state
    recorded = state.test_sample if state.test_sample is not None else TestSampleSettings()
    cap, declined = recorded.cap, list(recorded.declined_tasks)
    if keep:
        new = cs.take(test, new_ids, cap, state.seed)
    else:
        new = cs.CarriedSample.empty(state.image_size)
        declined.append(state.steps)
    learner.test_sample = cs.joined(learner.test_sample, new)
    state.test_sample = TestSampleSettings.of(learner.test_sample, state.num_classes, cap, declined)
