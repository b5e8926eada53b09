"""`sb add-task`: one new task for a learner on disk, in one pass downward: load, check, data, step, save.

The learner is locked against other writers from the start, everything is checked before an image
is decoded, and the learner changes on disk only when the step is saved; the old classes are
measured on their own test sets when these are found (:mod:`sbcli.run.evalsets`).

A learner can come from elsewhere. Pushed without ``--with-memory`` it holds no exemplars of its
classes: growing it as if nothing were missing would rehearse nothing of the old classes, silently,
so add-task refuses it unless ``--no-rehearsal`` asks for distillation alone. A pulled learner also
holds the model card and ONNX file of the step it was pushed at; after add-task these no longer
describe it, and the returned notes say what became of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sbcli.data import folder_classes, progress
from sbcli.data.catalog import open_spec, relabel, resolve_spec
from sbcli.data.fingerprint import Fingerprint, RunningFingerprint
from sbcli.data.imageset import ImageSet
from sbcli.data.source_records import check_dataset_name, remember_source
from sbcli.data.stream import FolderStream
from sbcli.engine import distributed
from sbcli.engine.hardware import resolve_device
from sbcli.engine.loop import Engine
from sbcli.errors import ConfigError, DataError, LearnerError
from sbcli.learner import preflight, validate
from sbcli.learner.records import TaskRecord
from sbcli.learner.state import Learner, LearnerState
from sbcli.learner.store.lock import writer_lock
from sbcli.methods import METHODS
from sbcli.methods.base import balance_epochs
from sbcli.methods.memory import class_quotas
from sbcli.run import banner, evalsets
from sbcli.run.plan import announce_plan
from sbcli.run.sequence import check_keep, save_from_main
from sbcli.run.steps import StepSummary, learn_step
from sbcli.watch.watcher import WatcherLike, watchers_of

PUBLISHED_FILES = ("README.md", "model.onnx")  # what an export or a pull leaves in a learner directory
DECODED_COPIES = 3  # a decoded set, its relabelled copy and the training device's copy are alive at once


@dataclass(frozen=True)
class AddTaskOptions:
    """What `sb add-task` may change about how a step is learned and recorded."""

    epochs: int | None = None  # epochs of this step and later ones (recorded); None: as recorded
    method: str | None = None  # checked against the learner's own method, which it keeps
    warmup_epochs: float | None = None  # warm-up of this step and later ones (recorded); None: as recorded
    data_roots: list[Path] = field(default_factory=list)  # where moved test sets of earlier tasks now are
    test_sample: bool = True  # carry a sample of the new classes' test images
    no_rehearsal: bool = False  # grow without exemplars of the old classes (a learner pulled without memory)
    balance_epochs: int | None = None  # class-balanced fine-tuning after this step and later ones (recorded); None: as recorded
    name: str | None = None  # what the new data is called on the card (default: the folder above train/test)


def add_task(learner_dir: Path, folder: Path, test: Path | None = None, *, device: str = "auto",
             keep: int | None = None, options: AddTaskOptions | None = None,
             on_progress: WatcherLike = None) -> StepSummary:
    """Learn the classes of ``folder`` as a new task of the learner at ``learner_dir`` (:func:`sbcli.api.add_task`)."""
    check_keep(keep)
    opts = options or AddTaskOptions()
    check_dataset_name(opts.name)
    learner_dir, main = Path(learner_dir), distributed.is_main_process()
    with watchers_of(on_progress if main else None) as watchers, writer_lock(learner_dir, "add-task", enabled=main):
        dev = resolve_device(device)  # load
        learner = Learner.load(learner_dir, dev, recover=not main)  # the writer's lock recovered it
        state = learner.state
        logged = {"learner": str(learner_dir), "folder": str(folder), "method": state.method,  # what logs record: as loaded
                  "method_config": dataclasses.asdict(state.method_config),
                  "train": {**dataclasses.asdict(state.train_config), "epochs": opts.epochs or state.train_config.epochs}}
        before = sum(h.epochs_trained for h in state.history)  # a log's epochs count on from there
        _check(learner, learner_dir, opts)  # check (the lock proved the directory writable)
        folder_classes.check_new_classes(folder, test, state.class_names, _known_refusal(learner))  # by folder names
        spec = resolve_spec(str(folder), test=None if test is None else str(test), image_size=state.image_size,
                            data_root=None, download=False)
        if spec["kind"] != "folder":
            raise DataError(f"{folder} is not a class-per-folder directory; add-task takes one folder per new class.")
        listed = FolderStream.scan(Path(spec["path"]), state.image_size)  # nothing decoded yet
        trains = _trains(state, len(set(listed.class_names) - set(state.class_names)))
        stream = listed if _streams(learner, trains) else None
        if stream is None:
            preflight.check_memory(DECODED_COPIES * listed.decoded_bytes(), f"the {len(listed):,} new images decoded "
                                   f"at {state.image_size} px")
        opened = open_spec(spec, train=stream is None)
        new = [c for c in listed.class_names if c not in state.class_names]
        names = state.class_names + new
        order = torch.tensor([names.index(c) for c in listed.class_names], dtype=torch.long)
        train_set = (relabel(opened.train, names, list(listed.class_names)) if stream is None  # in the learner's order
                     else ImageSet.labels_only(order[listed.labels], names))
        known_images = int((train_set.labels < state.num_classes).sum())
        no_images = ImageSet(torch.zeros(0, 3, state.image_size, state.image_size, dtype=torch.uint8),
                             torch.zeros(0, dtype=torch.long), names)
        new_test = relabel(opened.test, names, new) if opened.test else no_images
        start = banner.banner(len(new), len(listed) - known_images, len(opened.test) if opened.test is not None else 0,
                              state.image_size, banner.folder_sizes(Path(spec["path"])), f"{state.arch}, width x{state.width:g}",
                              state.train_config, dev, trains=trains, options=logged, epochs_before=before,
                              known_images=known_images)
        preflight.check_free_space(learner_dir, preflight.save_bytes(state.arch, state.width, state.num_classes + len(new),
                                                                     state.image_size, state.memory.budget))
        old = evalsets.test_data(learner, opts.data_roots) if state.tasks else None
        parts = [p for p in (old.test if old else None, new_test) if p is not None and len(p)]
        test_set = ImageSet.joined(parts, names) if parts else no_images
        published = [name for name in PUBLISHED_FILES if (learner_dir / name).is_file()]
        watchers.on_start(start)  # step
        announce_plan(watchers, state, [*(state.class_task.count(t) for t in range(state.steps)), len(new)])
        engine = Engine(state.train_config, dev, learner.norm, state.seed * 1000 + state.steps, watchers)
        features, seen = (None, opened.train) if stream is None else stream_features(stream, engine, learner.model)
        record = TaskRecord(new, remember_source(spec, seen, opened.test, opts.name))
        step = learn_step(learner, train_set, test_set, new, engine, record, features=features,
                          known_images=known_images)
        evalsets.carry(learner, new_test, list(range(len(names) - len(new), len(names))), opts.test_sample)
        save_from_main(learner, learner_dir, keep)  # save
        notes = ([old.describe()] if old else []) + _published_notes(learner_dir, published, state.steps)
        summary = dataclasses.replace(step, notes=notes, state=state)
        watchers.on_step(summary)
        return summary


def _known_refusal(learner: Learner) -> str | None:
    """None where this learner's step may add images of classes it knows; otherwise why not, in a clause."""
    spec, state = METHODS.get(learner.state.method), learner.state
    if not spec.known_images:
        if not spec.frozen_backbone:
            return (f"--method {state.method} retrains its backbone at every step, and the images those classes were "
                    "learned from are gone: trained on new images of them alone, it would pull them away from "
                    "everything else it knows")
        return (f"--method {state.method} keeps its classes as means, not as the sums an exact update of a learned "
                "class needs")
    if learner.memory.budget > 0:
        return "a learner that keeps exemplars (--memory) cannot take more images of a known class yet"
    return None


def _streams(learner: Learner, trains: bool) -> bool:
    """Whether the new images pass the backbone as a stream (never all decoded at once): a method that takes
    precomputed features, at a step that trains nothing and needs no pixels (SimpleCIL's flips do), for a
    learner that keeps no exemplars (whose selection needs the pixels) and holds none out (``--val-fraction``)."""
    state = learner.state
    return (METHODS.get(state.method).streams and not trains and not state.method_config.needs_pixels()
            and learner.memory.budget == 0 and state.train_config.val_fraction <= 0)


def stream_features(stream: FolderStream, engine: Engine, model: torch.nn.Module) -> tuple[torch.Tensor, Fingerprint]:
    """The pooled features [N, D] of every image of ``stream`` and the set's fingerprint, a batch at a time:
    what is held at once is one decoded batch and the one decoded ahead of it, never the set."""
    fingerprint = RunningFingerprint(stream.class_names, stream.labels)
    features: list[torch.Tensor] = []
    passed = progress.Counter(f"Decoding and passing the images in {stream.root} through the backbone", "images",
                              len(stream))
    for _first, images in stream.batches(each=fingerprint.update):  # fingerprinted on the decoding thread
        features.append(engine.frozen_features(model, images))
        passed.add(len(images))
    passed.done()
    return torch.cat(features), fingerprint.result()


def _check(learner: Learner, where: Path, opts: AddTaskOptions) -> None:
    """The learner grows as asked (its own method; exemplars of its classes to rehearse, unless
    ``--no-rehearsal``), and the settings that change from here on: ``--balance-epochs`` (refused below 0
    and under a rule that takes none), ``--epochs``, ``--warmup-epochs``, checked by the rules a load
    applies and recorded with the step, so later steps keep them."""
    state = learner.state
    if opts.method is not None and opts.method != state.method:
        raise ConfigError(f"The learner at {where} was trained with --method {state.method}, not {opts.method}; "
                          f"drop --method or start a new learner with `sb train --method {opts.method}`.")
    if not opts.no_rehearsal and state.steps > 0:
        quotas = class_quotas(learner.memory.budget, state.num_classes)
        held = learner.memory.per_class_counts()
        missing = [c for c, q in enumerate(quotas) if q > 0 and held.get(c, 0) == 0]
        if missing:
            raise LearnerError(f"The learner at {where} holds no exemplars of {len(missing)} of its {state.num_classes} "
                               "classes (it was pushed or pulled without its memory), so add-task could not rehearse "
                               "them; pass --no-rehearsal to grow it by distillation alone, or pull a push made with "
                               "--with-memory.")
    changes = {k: v for k, v in (("epochs", opts.epochs), ("warmup_epochs", opts.warmup_epochs)) if v is not None}
    if opts.balance_epochs is not None:
        if opts.balance_epochs < 0:
            raise ConfigError(f"--balance-epochs {opts.balance_epochs} is negative; give 0 (no balancing) or more.")
        changes["balance_epochs"] = balance_epochs(state.method, state.method_config, opts.balance_epochs, asked=True)
    validate.check_settings({"train_config": {**dataclasses.asdict(state.train_config), **changes}})
    state.train_config = dataclasses.replace(state.train_config, **changes)


def _trains(state: LearnerState, new: int) -> bool:
    """Whether this step trains: a frozen backbone's later steps do not (nor its first, unless it adapts)."""
    spec, epochs = METHODS.get(state.method), state.train_config.epochs
    if state.steps == 0:  # a learner with no classes yet: its first task
        return spec.first_plan(state.method_config, epochs) > 0
    return spec.plan(state.method_config, epochs, state.num_classes, state.num_classes + new) > 0


def _published_notes(learner_dir: Path, before: list[str], step: int) -> list[str]:
    """What became of the card and ONNX file of the previous step, in one sentence each."""
    notes = []
    for name in before:
        fate = "is now stale (it still describes" if (learner_dir / name).is_file() else "was removed (it described"
        redo = (f"`sb export {learner_dir} --to-hub REPO` pushes the card of step {step}" if name == "README.md"
                else f"`sb export {learner_dir} --format onnx -o model.onnx` writes step {step} outside the learner")
        notes.append(f"{name} in {learner_dir} {fate} step {step - 1}); {redo}.")
    return notes
