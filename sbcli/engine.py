"""The one training loop. A method describes its phases; the engine runs them.

Per phase: a fresh SGD (Nesterov) optimiser, a multi-step schedule whose milestones scale with
the phase's epochs (60/120/160 of 200 by default), batches drawn by permutation from
device-resident uint8 images, augmentation on the device, the teacher's forward in the same
step, bf16 autocast and channels-last on CUDA, float32 on CPU. Losses are summed on the device
and read once per epoch, so an epoch has no host synchronisation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from sbcli.data.device import DeviceData, Normalization, augment, normalize


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings shared by every phase (defaults: the authors' schedule, spec section 6)."""

    epochs: int = 200  # every phase: 200 epochs with a fresh optimiser
    batch_size: int = 256
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    milestones: tuple[float, ...] = (0.3, 0.6, 0.8)  # 60/120/160 of 200 epochs
    lr_decay: float = 0.1
    compile: bool = False  # torch.compile the student (CUDA; slower to start)
    eval_batch_size: int = 1024


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


@dataclass(frozen=True)
class ProgressEvent:
    """Emitted after every epoch, for the CLI to render."""

    task: int
    phase: str
    epoch: int
    epochs: int
    loss: float
    images_per_s: float


@dataclass
class PhaseReport:
    """What a phase did: its epochs, the final epoch's mean loss, time and throughput."""

    name: str
    epochs: int
    final_loss: float
    seconds: float
    images_per_s: float
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"name": self.name, "epochs": self.epochs, "final_loss": self.final_loss,
                "seconds": round(self.seconds, 3), "images_per_s": round(self.images_per_s, 1), **self.extra}


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.SGD:
    """SGD with Nesterov momentum and weight decay on every parameter; fused on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = device.type == "cuda"
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=True,
                           weight_decay=cfg.weight_decay, fused=fused or None)


def make_schedule(opt: torch.optim.Optimizer, cfg: TrainConfig, epochs: int) -> torch.optim.lr_scheduler.MultiStepLR:
    """Milestones at the configured fractions of the phase's epochs (60/120/160 of 200)."""
    milestones = sorted({max(1, round(f * epochs)) for f in cfg.milestones})
    return torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=cfg.lr_decay)


class Engine:
    """Runs phases on one device; emits a :class:`ProgressEvent` per epoch."""

    def __init__(self, cfg: TrainConfig, device: torch.device, norm: Normalization, seed: int,
                 on_progress: Callable[[ProgressEvent], None] | None = None) -> None:
        self.cfg = cfg
        self.device = device
        self.norm = norm
        self.generator = torch.Generator().manual_seed(seed)
        self.on_progress = on_progress
        self.task = 0
        self.channels_last = device.type == "cuda"
        self.autocast = device.type == "cuda"

    def run(self, model: nn.Module, data: DeviceData, phase: Phase) -> PhaseReport:
        """Train ``model`` for one phase on ``data``; the teacher (if any) runs in eval mode."""
        opt = make_optimizer(model, self.cfg, self.device)
        sched = make_schedule(opt, self.cfg, phase.epochs)
        step_fn = self._compiled(model)
        if phase.teacher is not None:
            phase.teacher.eval()
        start, seen, loss = time.perf_counter(), 0, float("nan")
        for epoch in range(1, phase.epochs + 1):
            model.train()
            epoch_start = time.perf_counter()
            total, count = torch.zeros((), device=self.device), 0
            for idx in data.batch_indices(self.cfg.batch_size, self.generator):
                total += self._step(step_fn, model, data, idx, phase, opt).detach()
                count += 1
            sched.step()
            loss = float(total) / max(count, 1)  # the epoch's one host synchronisation
            n = count * min(self.cfg.batch_size, len(data))
            seen += n
            self._emit(phase, epoch, loss, n / max(time.perf_counter() - epoch_start, 1e-9))
        seconds = time.perf_counter() - start
        return PhaseReport(phase.name, phase.epochs, loss, seconds, seen / max(seconds, 1e-9))

    def _step(self, step_fn: nn.Module, model: nn.Module, data: DeviceData, idx: torch.Tensor,
              phase: Phase, opt: torch.optim.Optimizer) -> torch.Tensor:
        x = augment(data.images[idx], self.norm, self.generator, self.channels_last)
        y = data.labels[idx]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            teacher_logits = None
            if phase.teacher is not None:
                with torch.no_grad():
                    teacher_logits = phase.teacher(x).float()
            logits = step_fn(x).float()
            loss = phase.loss(StepOutputs(model, x, y, logits, teacher_logits))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        for hook in phase.after_step:
            hook(model)
        return loss

    def _compiled(self, model: nn.Module) -> nn.Module:
        return torch.compile(model) if self.cfg.compile else model

    def _emit(self, phase: Phase, epoch: int, loss: float, rate: float) -> None:
        if self.on_progress is not None:
            self.on_progress(ProgressEvent(self.task, phase.name, epoch, phase.epochs, loss, rate))

    @torch.no_grad()
    def logits(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Logits (float32, on the CPU) of uint8 images, in large eval batches."""
        return self.features_or_logits(model, images, features=False)

    @torch.no_grad()
    def features(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Pooled features (float32, on the CPU) of uint8 images, in large eval batches."""
        return self.features_or_logits(model, images, features=True)

    @torch.no_grad()
    def features_or_logits(self, model: nn.Module, images: torch.Tensor, features: bool) -> torch.Tensor:
        was_training = model.training
        model.eval()
        outputs = []
        for start in range(0, len(images), self.cfg.eval_batch_size):
            x = normalize(images[start : start + self.cfg.eval_batch_size].to(self.device), self.norm, self.channels_last)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                out = model.forward_features(x) if features else model(x)
            outputs.append(out.float())
        model.train(was_training)
        if not outputs:
            return torch.zeros(0)
        return torch.cat(outputs).cpu()
