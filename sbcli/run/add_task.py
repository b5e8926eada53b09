"""`sb add-task`: one new task for a learner on disk, checked in full before an image is decoded.

The learner is locked against other writers from the start and changes on disk only when the step
is saved; the old classes are measured on their own test sets when these are found
(:mod:`sbcli.run.evalsets`), and a card or ONNX file that described the previous step is named.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from sbcli.data import folder_classes
from sbcli.data.catalog import open_spec, relabel, resolve_spec
from sbcli.data.imageset import ImageSet
from sbcli.data.records import check_dataset_name, remember_source
from sbcli.engine import distributed
from sbcli.engine.device import resolve_device
from sbcli.engine.loop import Engine
from sbcli.engine.progress import ProgressLike
from sbcli.errors import ConfigError, DataError
from sbcli.learner import preflight, validate
from sbcli.learner.state import Learner
from sbcli.learner.store.lock import writer_lock
from sbcli.run import banner, evalsets, growing
from sbcli.run.growing import AddTaskOptions
from sbcli.run.sequence import announce_plan, announce_start, check_keep, empty_like, save_from_main
from sbcli.run.steps import StepSummary, learn_step


def add_task(learner_dir: Path, folder: Path, test: Path | None = None, *, device: str = "auto",
             epochs: int | None = None, method: str | None = None, warmup_epochs: float | None = None,
             keep: int | None = None, options: AddTaskOptions | None = None,
             on_progress: ProgressLike | None = None) -> StepSummary:
    """Learn the classes of ``folder`` as a new task of the learner at ``learner_dir`` (:func:`sbcli.api.add_task`)."""
    check_keep(keep)
    opts = options or AddTaskOptions(epochs=epochs, method=method)
    check_dataset_name(opts.name)
    opts = dataclasses.replace(opts, epochs=opts.epochs if epochs is None else epochs, method=opts.method or method)
    with writer_lock(Path(learner_dir), "add-task", enabled=distributed.is_main_process()):
        return _add_task(Path(learner_dir), folder, test, device, opts, warmup_epochs, keep, on_progress)


def _add_task(learner_dir: Path, folder: Path, test: Path | None, device: str, opts: AddTaskOptions,
              warmup_epochs: float | None, keep: int | None, on_progress: ProgressLike | None) -> StepSummary:
    dev = resolve_device(device)
    learner = Learner.load(learner_dir, dev)
    preflight.check_writable(learner_dir)
    if opts.method is not None and opts.method != learner.state.method:
        raise ConfigError(f"The learner at {learner_dir} was trained with --method {learner.state.method}, not {opts.method}; "
                          f"drop --method or start a new learner with `sb train --method {opts.method}`.")
    growing.check_rehearsal(learner, learner_dir, opts.no_rehearsal)
    growing.set_balance(learner, opts.balance_epochs)  # checked before any data is read; saved with the step
    _set_schedule(learner, opts.epochs, warmup_epochs)
    spec = resolve_spec(str(folder), test=None if test is None else str(test), image_size=learner.state.image_size,
                        data_root=None, download=False)
    if spec["kind"] != "folder":
        raise DataError(f"{folder} is not a class-per-folder directory; add-task takes one folder per new class.")
    if test is not None:
        folder_classes.check_same_classes(Path(spec["path"]), Path(spec["test"]))
    opened = open_spec(spec)
    new = list(opened.train.class_names)
    clash = sorted(set(new) & set(learner.state.class_names))
    if clash:
        raise DataError(f"The learner already knows {', '.join(clash)}; rename those class folders or drop them.")
    state = learner.state
    start = banner.banner(len(new), len(opened.train), len(opened.test) if opened.test is not None else 0,
                          state.image_size, banner.folder_sizes(Path(spec["path"])), f"{state.arch}, width x{state.width:g}",
                          state.train_config, dev, trains=_trains(state, len(new)))
    preflight.check_free_space(learner_dir, preflight.save_bytes(state.arch, state.width, state.num_classes + len(new),
                                                                 state.image_size, state.memory["budget"]))
    old = evalsets.test_data(learner, opts.data_roots) if learner.state.tasks else None
    record = remember_source(spec, opened.train, opened.test, opts.name)
    names = learner.state.class_names + new
    num_old = len(learner.state.class_names)
    train_set = relabel(opened.train, names, new)
    new_test = relabel(opened.test, names, new) if opened.test else empty_like(train_set)
    parts = [p for p in (old.test if old else None, new_test) if p is not None and len(p)]
    test_set = ImageSet(torch.cat([p.images for p in parts]), torch.cat([p.labels for p in parts]), names) if parts else empty_like(train_set)
    published = growing.published_files(learner_dir)
    cfg = learner.state.train_config
    announce_start(on_progress, start)
    announce_plan(on_progress, learner.state, [*(learner.state.class_task.count(t) for t in range(learner.state.steps)), len(new)])
    engine = Engine(cfg, dev, learner.norm, learner.state.seed * 1000 + learner.state.steps, on_progress)
    step = learn_step(learner, train_set, test_set, new, engine, {"classes": new, "source": record})
    evalsets.carry(learner, new_test, list(range(num_old, len(names))), opts.test_sample)
    save_from_main(learner, learner_dir, keep)
    notes = ([old.describe()] if old else []) + growing.published_notes(learner_dir, published, learner.state.steps)
    return dataclasses.replace(step, notes=notes, state=learner.state)


def _set_schedule(learner: Learner, epochs: int | None, warmup_epochs: float | None) -> None:
    """`--epochs` and `--warmup-epochs` (recorded: later steps keep them), checked by the rules a load applies."""
    cfg = learner.state.train_config
    changes = {k: v for k, v in (("epochs", epochs), ("warmup_epochs", warmup_epochs)) if v is not None}
    validate.check_settings({"train_config": {**dataclasses.asdict(cfg), **changes}})
    learner.state.train_config = dataclasses.replace(cfg, **changes)


def _trains(state, new: int) -> bool:
    """Whether the step trains at all (a frozen-backbone method's later steps do not)."""
    from sbcli.methods import METHODS

    return METHODS.get(state.method).plan(state.method_config, state.train_config.epochs, state.num_classes,
                                          state.num_classes + new) > 0
