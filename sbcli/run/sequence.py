"""`sb train`'s sequence: check everything, open the source once, then learn its tasks one step at a time.

Each step is saved before the next starts (rank 0 alone writes under torchrun); with ``resume`` the
sequence continues from the last step stored. :mod:`sbcli.run.add_task` grows a learner by one task
with the helpers here (``--keep``, saving).
"""

from __future__ import annotations

import dataclasses
import logging
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sbcli import __version__
from sbcli.config.options import RunOptions, SequenceOptions
from sbcli.data import folder_classes
from sbcli.data.catalog import (
    Opened,
    compute_normalization,
    open_spec,
    relabel,
    resolve_spec,
    spec_image_size,
)
from sbcli.data.device import IMAGENET_MEAN, IMAGENET_STD, Normalization
from sbcli.data.imageset import ImageSet
from sbcli.data.source_records import check_dataset_name, remember_source, same_source
from sbcli.data.scenario import Scenario, make_scenario, task_sizes
from sbcli.data.shaping import only_classes, resize_opened, with_image_size
from sbcli.engine import distributed
from sbcli.engine.hardware import check_cpu_threads, resolve_device
from sbcli.engine.loop import Engine
from sbcli.errors import ConfigError, LearnerError
from sbcli.hub.pretrained import RANDOM
from sbcli.hub.weight_packages import check_input_size
from sbcli.learner import preflight, validate
from sbcli.learner.records import MemorySettings, PretrainedRecord, Provenance, SequencePlan, TaskRecord
from sbcli.learner.state import Learner, LearnerState, read_state
from sbcli.learner.store import legacy
from sbcli.learner.store.commit import after_commit
from sbcli.learner.store.lock import writer_lock
from sbcli.learner.store.outputs import check_output_dir
from sbcli.learner.validate import MAX_WIDTH
from sbcli.methods import METHODS, build_config
from sbcli.methods.memory import ExemplarMemory
from sbcli.nets import create_model, list_models
from sbcli.nets.timm_backbone import timm_input
from sbcli.run import banner, evalsets
from sbcli.run.plan import announce_plan
from sbcli.run.results import write_results
from sbcli.run.steps import StepSummary, learn_step
from sbcli.source_kinds import BENCHMARKS
from sbcli.watch.watcher import WatcherLike, Watchers, watchers_of

StepFn = Callable[[StepSummary], None]

LOG = logging.getLogger(__name__)


def train(seq: SequenceOptions, run: RunOptions, out: Path, *, resume: bool = False, keep: int | None = None,
          on_progress: WatcherLike = None, on_step: StepFn | None = None) -> Learner:
    """Learn a whole task sequence, saving the learner to ``out`` after every step (:func:`sbcli.api.train`).

    Everything that can be checked without reading images is checked first; ``out`` is locked for the whole run.
    The watchers ``on_progress`` are told every event of the run (:mod:`sbcli.watch.watcher`), ``on_step`` each step.
    """
    out = Path(out)
    device = check_run(run)
    check_keep(keep)
    _check_sequence(seq)
    check_dataset_name(seq.dataset_name)
    _check_folder_source(seq)
    if distributed.is_main_process():  # rank 0 alone writes: another rank would see its lock file (or add a probe)
        check_out(out, resume)
        preflight.check_writable(out)
    logged = {"sequence": dataclasses.asdict(seq), "run": dataclasses.asdict(run)}  # what logs record of the run
    main = distributed.is_main_process()
    with watchers_of(on_progress if main else None) as watchers, writer_lock(out, "train", create=True, enabled=main):
        return _train(seq, run, out, device, resume, keep, watchers, on_step, logged)


def check_run(run: RunOptions) -> torch.device:
    """The architecture, width, method options and memory of a run, refused in one sentence; the device to use."""
    if timm_input(run.arch) is not None:  # a timm architecture: known to timm, width 1, a method that takes one
        if run.width != 1.0:
            raise ConfigError(f"--width does not apply to --arch {run.arch} (timm builds it at its own width); drop --width.")
        if not METHODS.get(run.method).takes_timm:
            takers = ", ".join(n for n in METHODS.names() if METHODS.get(n).takes_timm)
            raise ConfigError(f"--arch {run.arch} is a timm backbone, which only --method {takers} take; "
                              f"--method {run.method} trains the partition of sbcli's own ResNets.")
    elif run.arch not in list_models():
        raise ConfigError(f"--arch {run.arch} is unknown; choose one of {', '.join(list_models())}.")
    if not 0 < run.width <= MAX_WIDTH:
        raise ConfigError(f"--width must be above 0 and at most {MAX_WIDTH} (e.g. 0.25 for a quarter-width network).")
    cfg = build_config(run.method, run.method_options)
    _check_not_silently_random(run, cfg)
    check_cpu_threads(run.train.threads)
    validate.check_settings({"arch": run.arch, "width": run.width, "method": run.method,
                             "method_config": dataclasses.asdict(cfg), "train_config": dataclasses.asdict(run.train),
                             "memory": {"budget": run.memory, "selection": run.selection, "seed": run.seed},
                             "seed": run.seed})
    ExemplarMemory(run.memory, run.selection, run.seed)
    return resolve_device(run.device)


def _check_not_silently_random(run: RunOptions, cfg: object) -> None:
    """A frozen backbone is never a random one by accident: it needs weights, training of its own, or ``--pretrained
    random`` (a random ResNet-18 frozen under prototypes scored 20 to 22 % on 20 classes, with no warning)."""
    spec = METHODS.get(run.method)
    if not spec.frozen_backbone or run.pretrained or timm_input(run.arch) is not None or getattr(cfg, "adapt_epochs", 0):
        return
    raise ConfigError(f"--method {run.method} freezes the backbone, which without --pretrained would stay a random "
                      "network; give --pretrained with a Hub repository (e.g. timm/resnet18.a1_in1k with --arch "
                      "resnet18-in --width 1), a .safetensors file or an sbcli learner directory, or --adapt-epochs N "
                      "to train it on the first task, or --pretrained random to freeze random weights on purpose.")


def check_keep(keep: int | None) -> None:
    """``--keep N`` keeps the last N steps' files: N is 1 or more."""
    if keep is not None and keep < 1:
        raise ConfigError(f"--keep {keep} keeps no step; give 1 or more (1 keeps only the current step).")


def sequence_scenario(seq: SequenceOptions, num_classes: int) -> Scenario:
    """The class order and task split of a sequence; with ``seq.classes``, only the order's first N classes.

    Raises:
        ConfigError: the class count or the task split does not fit the source.
    """
    if seq.classes is None:
        return make_scenario(num_classes, seq.order_seed, seq.tasks, seq.base, seq.increment, seq.class_order)
    if not 1 <= seq.classes <= num_classes:
        raise ConfigError(f"--classes {seq.classes} is outside 1..{num_classes}, the classes of this source.")
    order = make_scenario(num_classes, seq.order_seed, order=seq.class_order).order[: seq.classes]
    return Scenario(order=order, sizes=task_sizes(seq.classes, seq.tasks, seq.base, seq.increment))


def _check_sequence(seq: SequenceOptions) -> None:
    """Counts of tasks and classes are refused before any data is read when they cannot be right."""
    for flag, value in (("--tasks", seq.tasks), ("--base", seq.base), ("--increment", seq.increment),
                        ("--classes", seq.classes)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value} is not a count; give 1 or more.")
    if seq.image_size is not None:
        validate.check_settings({"image_size": seq.image_size})
    if seq.order_seed is not None and not 0 <= seq.order_seed < 2**32:  # numpy's seed range
        raise ConfigError(f"--order-seed {seq.order_seed} is outside 0..{2**32 - 1}; give a seed in that range "
                          "(or -1 to keep the dataset's own order).")


def _check_folder_source(seq: SequenceOptions) -> None:
    """A class-per-folder source, from its folder names alone: the test folder's classes and the first task's size."""
    path = None if seq.source in (None, *BENCHMARKS) else Path(seq.source).expanduser()
    if path is None or not path.is_dir() or (path / "wnids.txt").is_file():
        return
    if seq.test is not None and Path(seq.test).expanduser().is_dir():
        folder_classes.check_same_classes(path, Path(seq.test).expanduser())
    names = folder_classes.class_names(path)
    if names and all(any((path / name).iterdir()) for name in names):  # an empty class folder: the loader names it
        folder_classes.check_first_task(sequence_scenario(seq, len(names)).sizes)


def check_out(out: Path, resume: bool) -> None:
    """``--out`` before the writer's lock, which alone puts back what an interrupted 0.1 save left beside it:
    that learner is read where it lies, and counts as the one ``out`` holds."""
    left = legacy.recoverable(out)
    check_output_dir(out, option="--out", resume=resume)
    if left is not None and not resume:
        raise LearnerError(f"{out} holds no learner, but an interrupted save left one beside it ({left.name}) that "
                           "sbcli puts back; pass --resume to continue it, or choose another --out.")
    here = out if (out / "learner.json").is_file() else left
    if resume and here is None:
        raise LearnerError(f"--resume was given but {out} holds no learner; drop --resume to start a new one.")
    if resume and read_state(here, recover=False).plan is None:  # pulled as a backbone (or older): grown by add-task, task by task
        raise LearnerError(f"The learner at {out} records no task sequence to resume (it began with no classes, or an "
                           f"older sbcli saved it); grow it with `sb add-task {out} FOLDER`.")


def new_state(run: RunOptions, image_size: int, norm: dict, plan: SequencePlan | None, dataset: str | None) -> LearnerState:
    """A new learner's state: no classes, the run's settings (``plan``: the sequence for --resume, None for a learner
    grown task by task; ``dataset``: the source's kind, None before any)."""
    cfg = build_config(run.method, run.method_options)
    return LearnerState(
        arch=run.arch, width=run.width, image_size=image_size, normalization=norm, method=run.method,
        method_config=cfg, train_config=run.train,
        memory=MemorySettings(run.memory, run.selection, run.seed), seed=run.seed, plan=plan,
        provenance=Provenance(dataset, __version__, torch.__version__, platform.python_version()),
    )


def _train(seq: SequenceOptions, run: RunOptions, out: Path, device: torch.device, resume: bool, keep: int | None,
           watchers: Watchers, on_step: StepFn | None, logged: dict) -> Learner:
    timm_in = timm_input(run.arch)  # --arch timm/NAME: its resolution, statistics and weights
    weights = None if resume else load_weights(run)  # fetched and checked before any data is read
    seq = _weights_image_size(seq, weights, timm_in, out if resume else None)
    spec = with_image_size(resolve_spec(seq.source, test=seq.test, image_size=seq.image_size, data_root=seq.data_root,
                                        download=seq.download), seq.image_size)
    opened = open_spec(spec, download=seq.download)
    sizes = banner.folder_sizes(Path(spec["path"])) if spec["kind"] == "folder" else banner.native_sizes(opened.train.images)
    record = remember_source(spec, opened.train, opened.test, seq.dataset_name)
    names = opened.train.class_names
    scenario = sequence_scenario(seq, len(names))
    folder_classes.check_first_task(scenario.sizes)
    opened = resize_opened(only_classes(opened, scenario.order), spec)
    image_size = spec.get("image_size") or spec_image_size(spec)
    preflight.check_free_space(out, preflight.save_bytes(run.arch, run.width, len(scenario.order), image_size, run.memory))
    plan = SequencePlan(record, scenario.to_json())
    if resume:
        learner = Learner.load(out, device, recover=not distributed.is_main_process())  # the writer's lock recovered it
        _check_same_weights(learner, run, out)
        stored = learner.state.plan
        if stored is None or stored.scenario != plan.scenario or not same_source(stored.source, record):
            raise LearnerError(f"The learner at {out} was started with another source or task split; resume it with the same options.")
    else:
        state = new_state(run, image_size, normalization(opened, weights, timm_in).to_json(), plan, spec["kind"])
        learner = new_learner(state, run, scenario.sizes[0], weights, device)
    ordered = [names[c] for c in scenario.order]
    watchers.on_start(banner.banner(
        len(scenario.order), len(opened.train), len(opened.test) if opened.test is not None else 0, image_size, sizes,
        f"{learner.state.arch}, width x{learner.state.width:g}", learner.state.train_config, device,
        trains=_trains(learner.state, scenario.sizes), options=logged))
    announce_plan(watchers, learner.state, scenario.sizes)
    for step in range(learner.state.steps, len(scenario.sizes)):
        torch.manual_seed(run.seed * 1000 + step)  # new head rows, extra networks: the same whether resumed or not
        new = [names[c] for c in scenario.tasks[step]]
        seen = ordered[: sum(scenario.sizes[: step + 1])]
        summary_ = _learn(learner, opened, new, seen, ordered, record, device, run.seed, watchers, seq.test_sample)
        save_from_main(learner, out, keep)
        with after_commit(out, learner.state.steps):  # telling of a step already saved
            watchers.on_step(summary_)
            if on_step and distributed.is_main_process():
                on_step(summary_)
    return learner


def load_weights(run: RunOptions, hub_cfg: Any = None) -> Any:
    """The pretrained backbone a new learner starts from (:class:`sbcli.hub.pretrained.PretrainedWeights`):
    ``--pretrained``, else the weights timm names for ``--arch timm/NAME``; None without either, or with
    ``--pretrained random``."""
    timm_in = timm_input(run.arch)
    if not (run.pretrained or timm_in) or run.pretrained == RANDOM:
        return None
    from sbcli.hub import pretrained

    ref = run.pretrained or timm_in.weights
    return pretrained.load(ref, run.arch, run.width, sha256=run.pretrained_sha256, hub_cfg=hub_cfg)


def _check_same_weights(learner: Learner, run: RunOptions, out: Path) -> None:
    """``--resume`` with ``--pretrained``: the weights must be the ones the learner grew from (by SHA-256).

    Raises:
        LearnerError: other weights, or weights given to a learner that grew from none.
    """
    if not run.pretrained or run.pretrained == RANDOM:
        return
    from sbcli.hub import pretrained

    recorded = learner.state.provenance.backbone
    given = pretrained.load(run.pretrained, learner.state.arch, learner.state.width).info
    if (None if recorded is None else recorded.sha256) != given.sha256:
        was = "no weights" if recorded is None else recorded.origin + (
            f" (SHA-256 {recorded.sha256[:12]}...)" if recorded.sha256 else "")
        raise LearnerError(f"The learner at {out} grew from {was}, not from --pretrained {run.pretrained} (SHA-256 "
                           f"{str(given.sha256)[:12]}...); drop --pretrained to resume it, or start a new learner.")


def _weights_image_size(seq: SequenceOptions, weights: Any, timm_in: Any, resumed: Path | None) -> SequenceOptions:
    """The sequence at the resolution the backbone's weights were trained at (their record's ``input_size``:
    timm's configuration, 224 for other ImageNet weights; resuming a learner that adopted it, its own) when
    ``--image-size`` is not given; a given one is kept, and said in one line of the log when it is another."""
    if resumed is not None and (resumed / "learner.json").is_file():  # the resolution it began at, asked or adopted
        state = read_state(resumed, recover=not distributed.is_main_process())  # the writer's lock recovered it
        adopted = seq.image_size is None and (
            timm_in is not None or (state.provenance.backbone or PretrainedRecord(RANDOM)).input_size is not None)
        return dataclasses.replace(seq, image_size=state.image_size) if adopted else seq
    record = weights.info if weights is not None else PretrainedRecord(RANDOM)
    check_input_size(record, seq.image_size)
    size = record.input_size or (timm_in.image_size if timm_in is not None else None)
    if size is None:
        return seq
    if seq.image_size is None:
        return dataclasses.replace(seq, image_size=int(size))
    if seq.image_size != size and distributed.is_main_process():
        origin = record.repo or record.name or (timm_in.weights if timm_in is not None else None)
        LOG.warning(
            "--image-size %d is not %d, the resolution the pretrained weights%s were trained at: the images are "
            "resized to %d as asked (drop --image-size to use %d).", seq.image_size, size,
            f" ({origin})" if origin else "", seq.image_size, size)
    return seq


def normalization(opened: Opened | None, weights: Any, timm_in: Any) -> Normalization:
    """The statistics a new learner normalises with: a pretrained backbone's (ImageNet's, an sbcli learner's own,
    or timm's configuration), else the training images' (``opened``: needed only without weights)."""
    if timm_in is not None:
        return Normalization(timm_in.mean, timm_in.std)
    if weights is not None and weights.normalization is not None:
        return Normalization.from_json(weights.normalization)
    if weights is not None:
        return Normalization(IMAGENET_MEAN, IMAGENET_STD)
    return opened.norm or compute_normalization(opened.train.images)


def new_learner(state: LearnerState, run: RunOptions, first_classes: int, weights: Any, device: torch.device) -> Learner:
    """A learner's first network (its weights seeded by --seed alone, or the pretrained backbone) and empty memory;
    the provenance records which weights it grew from."""
    torch.manual_seed(run.seed)  # the initial weights depend on the seed alone, not on what ran before
    model = create_model(run.arch, first_classes, run.width, run.train.zero_init_residual)
    if weights is not None:
        from sbcli.hub import pretrained

        pretrained.apply(model, weights)
        state.provenance = dataclasses.replace(state.provenance, pretrained=weights.record)
    elif run.pretrained == RANDOM:
        state.provenance = dataclasses.replace(state.provenance, pretrained={"source": RANDOM})
    return Learner(state, model.to(device), ExemplarMemory(run.memory, run.selection, run.seed))


def _trains(state: LearnerState, sizes: list[int]) -> bool:
    """Whether any step of the sequence trains (a frozen-backbone method without adaptation trains none)."""
    spec = METHODS.get(state.method)
    epochs = state.train_config.epochs
    later = (spec.plan(state.method_config, epochs, sum(sizes[:t]), sum(sizes[: t + 1])) for t in range(1, len(sizes)))
    return spec.first_plan(state.method_config, epochs) > 0 or any(e > 0 for e in later)


def _learn(learner: Learner, opened: Opened, new: list[str], seen: list[str], ordered: list[str], source: dict,
           device: torch.device, seed: int, watchers: Watchers, carry_sample: bool) -> StepSummary:
    train_set = relabel(opened.train, ordered, new)
    test_set = relabel(opened.test, ordered, seen) if opened.test is not None else empty_like(opened.train)
    engine = Engine(learner.state.train_config, device, learner.norm, seed * 1000 + learner.state.steps, watchers)
    step = learn_step(learner, train_set, test_set, new, engine, TaskRecord(new, source),
                      seen_train=lambda: relabel(opened.train, ordered, seen))
    evalsets.carry(learner, test_set, [ordered.index(n) for n in new], carry_sample)
    return step


def save_from_main(learner: Learner, out: Path, keep: int | None = None) -> None:
    """Save the learner from rank 0 alone (any process when there is one).

    With several processes, every rank first takes rank 0's exemplars and method state, so that
    all continue from what was written; the others wait until the write is done.
    """
    group = distributed.info()
    memory = learner.memory
    memory.images, memory.labels, learner.extra = distributed.broadcast_objects(
        [memory.images, memory.labels, learner.extra], group)
    if group.is_main:
        learner.save(out, keep)
        with after_commit(out, learner.state.steps):  # Ctrl-C from here on: the step is saved, say so
            write_results(learner.state, out)
    with after_commit(out, learner.state.steps):
        distributed.barrier(group)


def empty_like(like: ImageSet) -> ImageSet:
    """No images, with the classes of ``like`` (a step without test images)."""
    return ImageSet(like.images[:0], like.labels[:0], like.class_names)
