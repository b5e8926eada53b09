"""The one training loop. A method describes its phases; the engine runs them.

Per phase: a fresh SGD (Nesterov) optimiser, a multi-step schedule whose milestones scale with
the phase's epochs (60/120/160 of 200 by default) after an optional linear warm-up
(:mod:`sbcli.engine.schedule`), batches drawn by permutation from
device-resident uint8 images, augmentation on the device, the teacher's forward in the same
step, channels-last everywhere (oneDNN on CPU is faster with it too), bf16 autocast wherever the
device computes in bf16 natively (see :func:`native_bf16`; ``TrainConfig.precision`` overrides it),
a fused optimiser on CUDA, and on one GPU each step replayed as a CUDA graph (:mod:`sbcli.engine.graphs`).
Losses are summed on the device and read once per epoch, so an epoch has no host synchronisation
(tests/test_gpu.py counts them on CUDA). Evaluation runs in full float32, without TF32 on CUDA (:func:`sbcli.engine.hardware.exact_float32`).
Measurements: docs/lab/performance.md (benchmarks/engine_speed.py).

Under torchrun (see :mod:`sbcli.engine.distributed`) the student is wrapped in DistributedDataParallel:
every rank draws the same permutation and trains on its slice of each batch, the epoch's loss is
summed over ranks, rank 0's weights and buffers are broadcast when a phase ends, and evaluation
is sharded over ranks and gathered on each.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from sbcli.data.device import DeviceData, Normalization, augment, normalize
from sbcli.defaults import base
from sbcli.engine import distributed, graphs, onnx_features, schedule
from sbcli.engine.hardware import (
    PRECISIONS,
    compute_threads,
    cudnn_autotune,
    exact_float32,
    uses_bf16,
)
from sbcli.engine.schedule import PhaseSchedule
from sbcli.engine.selection import PhaseSelection, Validator
from sbcli.errors import ConfigError, TrainingError
from sbcli.watch.watcher import ProgressEvent, WatcherLike, watchers_of


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings shared by every phase (defaults: the ``value`` column of :data:`sbcli.defaults.DEFAULTS`,
    the authors' schedule, docs/method.md §6).

    Each field is a CLI option of the same name (``--weight-decay``) and a recipe key
    (:mod:`sbcli.config.options`), and is recorded in the learner's ``train_config``.
    """

    epochs: int = base("epochs")  # every phase: a fresh optimiser
    batch_size: int = base("batch_size")
    lr: float = base("lr")
    momentum: float = base("momentum")
    nesterov: bool = base("nesterov")  # authors' code: SGD with Nesterov momentum
    weight_decay: float = base("weight_decay")
    milestones: tuple[float, ...] = base("milestones")  # fractions of a phase's epochs
    lr_decay: float = base("lr_decay")  # the schedule's gamma at every milestone
    drop_last: bool = base("drop_last")  # authors' code: an epoch drops its last partial batch (unless it is the only one)
    compile: bool = base("compile")  # torch.compile the student and the teacher (once per phase; slower to start)
    cuda_graphs: bool = base("cuda_graphs")  # on a GPU, one process, without compile: replay each step as a CUDA graph
    eval_batch_size: int = base("eval_batch_size")
    precision: str = base("precision")  # auto: bf16 autocast where the device has native bf16 (native_bf16); "bf16" / "fp32"
    threads: int | None = base("threads")  # CPU compute threads while training and evaluating; None: torch's default
    warmup_epochs: float = base("warmup_epochs")  # linear lr warm-up at the start of every phase (sbcli.engine.schedule); 0: the paper's
    zero_init_residual: bool = base("zero_init_residual")  # last BN of each residual block starts at 0 (each block the identity)
    val_fraction: float = base("val_fraction")  # held out of each step's data to pick every phase's best epoch (sbcli.engine.selection)
    val_every: int = base("val_every")  # epochs between validation scores; 0: a fifth of the phase
    incremental_lr: float | None = base("incremental_lr")  # the lr of every phase after the first step; None: ``lr`` (the paper's)
    balance_epochs: int = base("balance_epochs")  # class-balanced fine-tuning on the memory after each later step (sbcli.methods.balance); 0: none
    balance_lr: float = base("balance_lr")  # its learning rate
    balance_before_wa: bool = base("balance_before_wa")  # under WA: balance first, then align (default: align, then balance)

    def __post_init__(self) -> None:
        if not 0 <= self.val_fraction < 1:
            raise ConfigError(f"--val-fraction {self.val_fraction} is outside [0, 1); e.g. 0.1 holds out a tenth.")
        if self.warmup_epochs < 0:
            raise ConfigError(f"--warmup-epochs {self.warmup_epochs} is negative; give 0 (no warm-up) or more.")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision} is unknown; choose one of {', '.join(PRECISIONS)}.")
        if self.epochs < 1 or self.batch_size < 1 or self.eval_batch_size < 1:
            raise ConfigError("--epochs, --batch-size and --eval-batch-size must be at least 1.")
        if self.balance_epochs < 0 or self.balance_lr <= 0 or (self.incremental_lr is not None and self.incremental_lr <= 0):
            raise ConfigError("--balance-epochs must not be negative, --balance-lr and --incremental-lr must be above 0.")
        if self.lr < 0 or self.momentum < 0 or self.weight_decay < 0 or not 0 < self.lr_decay <= 1:
            raise ConfigError("--lr, --momentum and --weight-decay must not be negative, --lr-decay in (0, 1].")
        if self.nesterov and self.momentum == 0:
            raise ConfigError("Nesterov momentum needs --momentum above 0; give --momentum or --no-nesterov.")
        if not all(0 < f <= 1 for f in self.milestones):
            raise ConfigError(f"--milestones are fractions of a phase's epochs in (0, 1], not {self.milestones}.")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {self.threads}.")


@dataclass(frozen=True)
class StepOutputs:
    """What a phase's loss sees for one batch."""

    model: nn.Module
    inputs: torch.Tensor
    targets: torch.Tensor
    logits: torch.Tensor
    teacher_logits: torch.Tensor | None


LossFn = Callable[[StepOutputs], torch.Tensor]
StepHook = Callable[[nn.Module], None]


@dataclass(frozen=True)
class Phase:
    """One training phase: a loss, its epochs, an optional frozen teacher and per-step hooks."""

    name: str
    loss: LossFn
    epochs: int
    teacher: nn.Module | None = None
    after_step: Sequence[StepHook] = ()
    lr: float | None = None  # this phase's initial learning rate; None: the step's (``TrainConfig.lr``/``incremental_lr``)


@dataclass
class PhaseReport:
    """What a phase did: its epochs, the final epoch's mean loss, time and throughput."""

    name: str
    epochs: int
    final_loss: float
    seconds: float
    images_per_s: float
    precision: str = "fp32"  # what the steps computed in: "bf16" (autocast) or "fp32"
    processes: int = 1  # data-parallel processes that trained together (torchrun's world size)
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"name": self.name, "epochs": self.epochs, "final_loss": self.final_loss,
                "seconds": round(self.seconds, 3), "images_per_s": round(self.images_per_s, 1),
                "precision": self.precision, "processes": self.processes, **self.extra}

    @classmethod
    def from_json(cls, data: dict) -> PhaseReport:
        """A phase as a step's ``phases`` keep it; a learner written before a key existed reads its default
        (fp32, one process, no time), and keys this sbcli does not know stay in ``extra``."""
        known = ("name", "epochs", "final_loss", "seconds", "images_per_s", "precision", "processes")
        return cls(data.get("name", ""), data.get("epochs", 0), data.get("final_loss", math.nan),
                   data.get("seconds", 0.0), data.get("images_per_s", 0.0), data.get("precision", "fp32"),
                   data.get("processes", 1), {k: v for k, v in data.items() if k not in known})


def phase_lr(cfg: TrainConfig, task: int, phase: Phase | None = None) -> float:
    """The initial learning rate of a phase of step ``task`` (1-based): the phase's own, else
    ``incremental_lr`` after the first step when set, else ``lr``."""
    if phase is not None and phase.lr is not None:
        return phase.lr
    return cfg.incremental_lr if task > 1 and cfg.incremental_lr is not None else cfg.lr


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device, lr: float | None = None) -> torch.optim.SGD:
    """SGD with momentum (Nesterov unless ``cfg.nesterov`` is off) and weight decay on every parameter; fused on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = device.type == "cuda"
    return torch.optim.SGD(params, lr=cfg.lr if lr is None else lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                           weight_decay=cfg.weight_decay, fused=fused or None)


def make_schedule(opt: torch.optim.Optimizer, cfg: TrainConfig, epochs: int, batches_per_epoch: int,
                  lr: float | None = None) -> PhaseSchedule:
    """Milestones at the configured fractions of the phase's epochs (60/120/160 of 200), after
    ``cfg.warmup_epochs`` of linear warm-up, from ``lr`` (default ``cfg.lr``)."""
    return schedule.make_schedule(opt, cfg.lr if lr is None else lr, cfg.milestones, cfg.lr_decay, epochs,
                                  batches_per_epoch, cfg.warmup_epochs)


class Engine:
    """Runs phases on one device; emits a :class:`ProgressEvent` per epoch.

    ``on_progress`` is told each batch, epoch and phase (:class:`sbcli.watch.watcher.Watcher`s, or a
    function of each epoch's event). The step a phase belongs to (its learning rate, its held-out
    images) is given to :meth:`for_step`, never set from outside.
    """

    def __init__(self, cfg: TrainConfig, device: torch.device, norm: Normalization, seed: int,
                 on_progress: WatcherLike = None) -> None:
        self.cfg = cfg
        self.device = device
        self.norm = norm
        self.dist = distributed.info()
        self.generator = torch.Generator().manual_seed(seed)  # permutations: the same on every rank
        self.augment_generator = self._augment_generator(seed)
        self.watchers = watchers_of(on_progress if self.dist.is_main else None)  # rank 0 alone reports
        self.task = 0  # the step's task number (its learning rate): given to for_step
        self.validator: Validator | None = None  # --val-fraction: the step's held-out images, given to for_step
        self.channels_last = True
        self.autocast = uses_bf16(cfg.precision, device)
        self.precision = "bf16" if self.autocast else "fp32"  # as run, for the progress lines and the record
        # a frozen backbone's onnxruntime pass by backbone and input size, shared by this run's steps (for_step)
        self.frozen_passes: dict[str, onnx_features.FeaturePass | None] = {}

    def for_step(self, task: int, validator: Validator | None = None) -> Engine:
        """This engine for the phases of one step: task number ``task`` (its learning rate) and, with
        ``--val-fraction``, the held-out images that pick each phase's best epoch. ``self`` is unchanged;
        both share the generators, so the draws go on where the last step left them."""
        step = copy.copy(self)
        step.task, step.validator = task, validator
        return step

    def _augment_generator(self, seed: int) -> torch.Generator:
        """Crop/flip draws: the permutation's generator on one CPU process (as it always was),
        else a generator on the device (no host copy per batch), seeded apart on every rank."""
        if self.device.type == "cpu" and not self.dist.enabled:
            return self.generator
        return torch.Generator(device=self.device).manual_seed(distributed.rank_seed(seed, self.dist.rank))

    def run(self, model: nn.Module, data: DeviceData, phase: Phase) -> PhaseReport:
        """Train ``model`` for one phase on ``data``; the teacher (if any) runs in eval mode.

        Everything built here (layout, optimiser, DDP wrapper, compiled graphs) is built once per
        phase; the epoch loop only launches work and reads the loss once per epoch. While the phase
        computes, cuDNN autotunes its kernels on CUDA (batch shapes are fixed) and, with
        ``cfg.threads``, the CPU computes on that many threads; the process's own settings are
        restored afterwards.
        """
        graphs_on = self._graphs_on()
        self._to_layout(model, phase.teacher)
        lr = phase_lr(self.cfg, self.task, phase)
        opt = make_optimizer(model, self.cfg, self.device, lr)
        sched = make_schedule(opt, self.cfg, phase.epochs, schedule.steps_per_epoch(len(data), self.cfg.batch_size,
                                                                                 self.cfg.drop_last), lr)
        student = self._compiled(distributed.data_parallel(model, self.device, self.dist))
        teacher = None if phase.teacher is None else self._compiled(phase.teacher.eval())

        def step(idx: torch.Tensor, set_to_none: bool = True) -> torch.Tensor:
            return self._step(student, teacher, model, data, idx, phase, opt, set_to_none)

        with cudnn_autotune(self.device), compute_threads(self.cfg.threads):
            graphed = None
            if graphs_on:
                graphs.device_lr(opt, self.device)
                graphed = graphs.GraphedStep(step, self.device, self.augment_generator, self.cfg.batch_size)
            start, seen, loss = time.perf_counter(), 0, float("nan")
            selection = PhaseSelection.start(self.validator, model)
            for epoch in range(1, phase.epochs + 1):
                student.train()
                epoch_start = time.perf_counter()
                total, count = torch.zeros((), device=self.device), 0
                size, bs = len(data), self.cfg.batch_size  # the batches batch_indices yields, for the live bars
                batches = size // bs if self.cfg.drop_last and size >= bs else -(-size // bs)
                for batch in data.batch_indices(self.cfg.batch_size, self.generator, self.cfg.drop_last):
                    idx = distributed.shard(batch, self.dist)
                    sched.before_step()
                    total += (step(idx) if graphed is None else graphed(idx)).detach()
                    count += 1
                    self.watchers.on_batch(count, batches)
                lr = sched.current
                sched.step()
                loss = self._epoch_loss(total, count)  # the epoch's one host synchronisation
                self._check_finite(loss, phase, epoch)
                n = count * min(self.cfg.batch_size, len(data))  # over all ranks
                seen += n
                rate = n / max(time.perf_counter() - epoch_start, 1e-9)
                self.watchers.on_epoch(ProgressEvent(self.task, phase.name, epoch, phase.epochs, loss, rate,
                                                     self.precision, lr))
                if selection is not None:
                    selection.after_epoch(self, model, epoch, phase.epochs)
            extra = {} if selection is None else selection.finish(model, phase.epochs)
            if graphed is not None:
                extra["cuda_graph"] = graphed.status
            distributed.broadcast_module(model, self.dist)
            seconds = time.perf_counter() - start
            report = PhaseReport(phase.name, phase.epochs, loss, seconds, seen / max(seconds, 1e-9),
                                 precision=self.precision, processes=self.dist.world_size, extra=extra)
            self.watchers.on_phase(report)
            return report

    def _step(self, student: nn.Module, teacher: nn.Module | None, model: nn.Module, data: DeviceData,
              idx: torch.Tensor, phase: Phase, opt: torch.optim.Optimizer, set_to_none: bool = True) -> torch.Tensor:
        """One optimiser step on batch ``idx``; its loss, on the device. The same code is captured as a
        CUDA graph (:mod:`sbcli.engine.graphs`): nothing here may read the device from the host."""
        x = augment(data.images[idx], self.norm, self.augment_generator, self.channels_last)
        y = data.labels[idx]
        # no autocast weight cache: each weight is cast once a step anyway, and a graph capture forbids it
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast, cache_enabled=False):
            teacher_logits = None
            if teacher is not None:
                with torch.no_grad():
                    teacher_logits = teacher(x).float()
            logits = student(x).float()
            loss = phase.loss(StepOutputs(model, x, y, logits, teacher_logits))
        opt.zero_grad(set_to_none=set_to_none)
        loss.backward()
        opt.step()
        for hook in phase.after_step:
            hook(model)
        return loss

    def _epoch_loss(self, total: torch.Tensor, count: int) -> float:
        """Mean loss of the epoch's steps over every rank (reads the device once)."""
        summed = distributed.all_reduce_sum(torch.stack([total.float(), total.new_tensor(float(count))]), self.dist)
        return float(summed[0]) / max(float(summed[1]), 1.0)

    def _check_finite(self, loss: float, phase: Phase, epoch: int) -> None:
        """Stop at once when training diverged: the step in progress is then never saved."""
        if not math.isfinite(loss):
            raise TrainingError(f"Training diverged: the loss became {loss} in epoch {epoch} of phase {phase.name} "
                                f"of step {self.task}, so the learner was left as it was; lower --lr "
                                f"(now {self.cfg.lr}) or check the data.")

    def _to_layout(self, *models: nn.Module | None) -> None:
        """Put weights in channels-last once per phase, so no convolution reorders them per step."""
        if self.channels_last:
            for m in models:
                if m is not None:
                    m.to(memory_format=torch.channels_last)

    def _graphs_on(self) -> bool:
        """Steps replayed as CUDA graphs: on a GPU, in one process (DDP's hooks are not captured here) and
        without ``--compile`` (which builds graphs of its own)."""
        return (self.cfg.cuda_graphs and self.device.type == "cuda" and not self.dist.enabled
                and not self.cfg.compile)

    def _compiled(self, model: nn.Module) -> nn.Module:
        """``torch.compile`` (once per phase: the wrapper is built here, graphs on first use)."""
        return torch.compile(model) if self.cfg.compile else model

    @torch.no_grad()
    def logits(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Logits (float32, on the CPU) of uint8 images, in large eval batches."""
        return self.features_or_logits(model, images, features=False)

    @torch.no_grad()
    def features(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Pooled features (float32, on the CPU) of uint8 images, in large eval batches."""
        return self.features_or_logits(model, images, features=True)

    @torch.no_grad()
    def frozen_features(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Pooled features (float32, CPU) under a backbone that never changes (``--method ranpac``, ``simplecil``):
        on onnxruntime where its export agrees with :meth:`features` (checked on the first images, then kept for
        the run and in sbcli's cache: :mod:`sbcli.engine.onnx_features`), else :meth:`features` itself."""
        if len(images) == 0:
            return self.features(model, images)
        key = f"{onnx_features.backbone_fingerprint(model)}-{images.shape[-1]}"
        if key not in self.frozen_passes:
            with compute_threads(self.cfg.threads):
                threads = torch.get_num_threads()
            self.frozen_passes[key] = onnx_features.prepare(
                model, images, lambda x: self.features(model, x), device=self.device, sharded=self.dist.enabled,
                norm=self.norm, threads=threads, batch=self.cfg.eval_batch_size)
        feature_pass = self.frozen_passes[key]
        return self.features(model, images) if feature_pass is None else feature_pass(images)

    def feature_runtime(self) -> str:
        """The runtime :meth:`frozen_features` takes here unless its check fails: what its results are keyed by."""
        return onnx_features.planned(self.device, self.dist.enabled)

    @torch.no_grad()
    def features_or_logits(self, model: nn.Module, images: torch.Tensor, features: bool) -> torch.Tensor:
        """Features or logits of ``images``; with several ranks each scores a shard, gathered on all.

        Always in float32, whatever the training precision: what ``sb evaluate`` reports is what the
        exported ONNX model and ``sb predict`` compute, and exemplar features do not depend on it.
        """
        with compute_threads(self.cfg.threads):
            was_training = model.training
            model.eval()
            lo, hi = distributed.shard_range(len(images), self.dist)
            # a rank with an empty shard still runs one empty batch, so that it has rows to gather
            starts = list(range(lo, hi, self.cfg.eval_batch_size)) or ([lo] if self.dist.enabled else [])
            outputs = []
            with exact_float32(self.device):
                for start in starts:
                    x = normalize(images[start : min(hi, start + self.cfg.eval_batch_size)].to(self.device), self.norm,
                                  self.channels_last)
                    outputs.append(model.forward_features(x) if features else model(x))
            model.train(was_training)
            if not outputs:
                return torch.zeros(0)
            return distributed.gather_rows(torch.cat(outputs), len(images), self.dist).cpu()
