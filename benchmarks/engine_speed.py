"""Training throughput of sbcli's engine against a conventional loop, and the paper's schedules.

Both loops train the same network (a student plus a frozen teacher copy, phase C's loss
lambda * KD + (1 - lambda) * CE, lambda = 1/2) on the same uint8 images, batch and device, in
one run:

* **engine**: :class:`sbcli.engine.loop.Engine` exactly as ``sb train`` runs it (device-resident
  uint8 images, permutation batches, crop/flip/normalise on the device for the whole batch,
  channels-last, bf16 autocast where the device computes bf16 natively (``--precision auto``, the
  default of ``sb train``; pass ``--precision auto,fp32`` for a float32 row too), a fused optimiser
  on CUDA, one host sync per epoch).
* **reference**: the way the authors' code and PyCIL feed a network: a ``Dataset`` holding the
  images as an HWC uint8 array and turning each into a PIL image, torchvision transforms
  (``RandomCrop(padding)``, ``RandomHorizontalFlip``, ``ToTensor``, ``Normalize``), a
  ``DataLoader``, a host-to-device copy per batch, float32 in the default (NCHW) layout, a
  non-fused SGD and ``loss.item()`` per step for the running loss. Its DataLoader workers are
  persistent and warmed up before timing, which favours the reference.

The two loops are measured in alternating rounds (engine, reference, engine, ...) so that a
shared, busy machine slows both alike; the median rate of each is reported. From the engine's
rate the script projects the wall time of the paper's full CIFAR-100 schedules (2/5/10/20 tasks,
docs/method.md §6): step 1 is 200 epochs on 50,000 / T images, a split step three phases of 200
epochs on 50,000 / T images plus the 2,000 exemplars, an unsplit step (bf = 1) one such phase.
Every image-epoch is costed at the measured phase-C rate (teacher included), which slightly
overstates step 1 (no teacher there) and understates phase A (its sparsity penalty).

Examples::

    nice -n 10 python benchmarks/engine_speed.py --device cpu --width 0.25 --seconds 30
    python benchmarks/engine_speed.py --device cuda --width 1.0 --batch-size 256 --seconds 20
    python benchmarks/engine_speed.py --device cuda --compile --json speed.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from sbcli.data.device import DeviceData, Normalization
from sbcli.engine.loop import Engine, Phase, TrainConfig, uses_bf16
from sbcli.methods.losses import ce_loss, kd_ce_loss
from sbcli.methods.split_bridge import bridge_loss
from sbcli.nets import create_model
from sbcli.nets.partition import make_partition

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from realdata import archive_path  # noqa: E402  (the one data setting: $SBCLI_TEST_DATA)

CIFAR10_ZIP = archive_path("cifar10-jpeg.zip")
CIFAR100_TRAIN = 50_000  # images: 100 classes x 500
CIFAR100_CLASSES = 100
PAPER_MEMORY = 2_000
PAPER_EPOCHS = 200
# docs/method.md §6: rho per number of equal tasks on CIFAR-100
PAPER_RHO = {2: 1.0, 5: 1.35, 10: 1.15, 20: 1.0}
LAMBDA = 0.5  # phase C with half the classes old


@dataclass(frozen=True)
class BenchConfig:
    """What one benchmark run measures."""

    device: str = "auto"
    arch: str = "resnet18"
    width: float = 1.0
    batch_size: int = 256
    image_size: int = 32
    classes: int = 100
    seconds: float = 20.0  # per measurement
    rounds: int = 3
    data: str = "auto"  # random, cifar10, or auto (cifar10 when the zip is present)
    images: int = 10_000
    workers: int = -1  # reference DataLoader workers; -1: 0 on CPU, min(8, cores) on CUDA
    compile: bool = False
    precisions: tuple[str, ...] = ("auto",)  # one engine row per TrainConfig.precision
    without_teacher: bool = False  # also an engine row per precision without a teacher (a first step: CE only)
    eager: bool = False  # also every engine row with --no-cuda-graphs (each kernel launched from Python)
    threads: int = 0  # torch.set_num_threads; 0 keeps torch's default
    seed: int = 0


@dataclass(frozen=True)
class Rate:
    """Images per wall-clock second and per CPU-second of this process (all its threads)."""

    wall: float
    cpu: float


class Stopwatch:
    """Wall-clock and process CPU time since construction."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def rate(self, images: int) -> Rate:
        _sync(self.device)
        return Rate(images / (time.perf_counter() - self.wall), images / max(time.process_time() - self.cpu, 1e-9))


@dataclass
class LoopResult:
    """The rates of one loop, one entry per round."""

    name: str
    rounds: list[Rate] = field(default_factory=list)

    @property
    def wall(self) -> float:
        return statistics.median(r.wall for r in self.rounds) if self.rounds else float("nan")

    @property
    def cpu(self) -> float:
        return statistics.median(r.cpu for r in self.rounds) if self.rounds else float("nan")

    def to_json(self) -> dict:
        return {"name": self.name, "img_s": self.wall, "img_per_cpu_s": self.cpu,
                "rounds": [{"wall": r.wall, "cpu": r.cpu} for r in self.rounds]}


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def random_images(count: int, size: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 noise images [N, 3, S, S] and uniform labels."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (count, 3, size, size), dtype=torch.uint8, generator=gen)
    return images, torch.randint(0, classes, (count,), generator=gen)


def cifar10_images(path: Path, count: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` training JPEGs of the CIFAR-10 zip, spread evenly over its classes, decoded."""
    from sbcli.data.sources import decode_image

    with zipfile.ZipFile(path) as archive:
        names = sorted(n for n in archive.namelist() if "/train/" in n and n.lower().endswith(".jpg"))
        step = max(1, len(names) // count)
        chosen = names[::step][:count]
        classes = sorted({n.split("/")[-2] for n in chosen})
        arrays = [decode_image(archive.read(n), size) for n in chosen]
    labels = torch.tensor([classes.index(n.split("/")[-2]) for n in chosen])
    return torch.from_numpy(np.stack(arrays)), labels


def load_data(cfg: BenchConfig) -> tuple[torch.Tensor, torch.Tensor, str]:
    """The benchmark's images, labels (folded into ``cfg.classes``) and a description."""
    use_cifar = cfg.data == "cifar10" or (cfg.data == "auto" and CIFAR10_ZIP.is_file())
    if cfg.data == "cifar10" and not CIFAR10_ZIP.is_file():
        raise SystemExit(f"--data cifar10 needs {CIFAR10_ZIP}; use --data random.")
    if use_cifar:
        images, labels = cifar10_images(CIFAR10_ZIP, cfg.images, cfg.image_size)
        return images, labels % cfg.classes, f"CIFAR-10 JPEG train subset ({len(labels)} images)"
    images, labels = random_images(cfg.images, cfg.image_size, cfg.classes, cfg.seed)
    return images, labels, f"random uint8 ({len(labels)} images)"


def repeat_to(images: torch.Tensor, labels: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` images, cycling through the set when it is smaller."""
    idx = torch.arange(count) % len(labels)
    return images[idx], labels[idx]


# ---------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------


def student_and_teacher(cfg: BenchConfig, device: torch.device) -> tuple[nn.Module, nn.Module]:
    """A fresh student and a frozen copy as teacher, on ``device``."""
    torch.manual_seed(cfg.seed)
    student = create_model(cfg.arch, cfg.classes, cfg.width).to(device)
    teacher = copy.deepcopy(student).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return student, teacher


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------


def engine_epoch_rate(cfg: BenchConfig, precision: str, device: torch.device, model: nn.Module,
                      teacher: nn.Module | None, images: torch.Tensor, labels: torch.Tensor, batches: int,
                      graphs: bool = True) -> Rate:
    """The rate of one engine phase of one epoch of ``batches`` full batches, its set-up included (on a GPU:
    three eager steps and the step's capture as a CUDA graph, unless ``graphs`` is off).

    With a teacher: phase C's loss (an incremental step); without: plain CE (a first step).
    """
    x, y = repeat_to(images, labels, batches * cfg.batch_size)
    data = DeviceData(x.to(device), y.to(device))
    train = TrainConfig(epochs=1, batch_size=cfg.batch_size, compile=cfg.compile, precision=precision,
                        cuda_graphs=graphs)
    engine = Engine(train, device, Normalization(), cfg.seed)
    if teacher is None:
        phase = Phase("base", lambda out: ce_loss(out.logits, out.targets), 1)
    else:
        phase = Phase("C", bridge_loss(cfg.classes // 2, LAMBDA), 1, teacher=teacher)
    watch = Stopwatch(device)
    engine.run(model, data, phase)
    return watch.rate(batches * cfg.batch_size)


# ---------------------------------------------------------------------------------------------
# The reference loop
# ---------------------------------------------------------------------------------------------


class ArrayDataset(torch.utils.data.Dataset):
    """Images as an HWC uint8 array, one PIL image per item, as ``torchvision.datasets.CIFAR10``."""

    def __init__(self, images_hwc: np.ndarray, labels: np.ndarray, transform: Callable) -> None:
        self.images = images_hwc
        self.labels = labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        return self.transform(Image.fromarray(self.images[index])), int(self.labels[index])


def reference_transform(size: int, norm: Normalization, augment: bool = True) -> Callable:
    """The authors' and PyCIL's CIFAR training transform (``augment=False``: ToTensor + Normalize only)."""
    from torchvision import transforms

    steps = [transforms.RandomCrop(size, padding=size // 8), transforms.RandomHorizontalFlip()] if augment else []
    return transforms.Compose([*steps, transforms.ToTensor(), transforms.Normalize(norm.mean, norm.std)])


def reference_loader(cfg: BenchConfig, device: torch.device, images: torch.Tensor,
                     labels: torch.Tensor) -> torch.utils.data.DataLoader:
    """A shuffling, last-batch-dropping DataLoader over PIL images (persistent workers when any)."""
    dataset = ArrayDataset(images.permute(0, 2, 3, 1).numpy(), labels.numpy(),
                           reference_transform(cfg.image_size, Normalization()))
    workers = reference_workers(cfg, device)
    return torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True, drop_last=True,
                                       num_workers=workers, persistent_workers=workers > 0,
                                       pin_memory=device.type == "cuda")


def reference_workers(cfg: BenchConfig, device: torch.device) -> int:
    if cfg.workers >= 0:
        return cfg.workers
    return min(8, os.cpu_count() or 1) if device.type == "cuda" else 0


def endless(loader: torch.utils.data.DataLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield from loader


def reference_step(model: nn.Module, teacher: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                   y: torch.Tensor, num_old: int) -> float:
    """One conventional step: teacher forward, student forward, lambda*KD + (1-lambda)*CE, SGD."""
    with torch.no_grad():
        teacher_logits = teacher(x)
    logits = model(x)
    loss = kd_ce_loss(logits, y, teacher_logits[:, :num_old], LAMBDA)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()  # the running loss, read every step as in PyCIL and the authors' code


def reference_optimizer(model: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)


def reference_rate(batches_iter: Iterator, device: torch.device, model: nn.Module, teacher: nn.Module,
                   opt: torch.optim.Optimizer, batches: int, num_old: int) -> Rate:
    """The rate of ``batches`` conventional steps, loading included (in this process with 0 workers)."""
    model.train()
    watch, seen = Stopwatch(device), 0
    for _ in range(batches):
        x, y = next(batches_iter)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        reference_step(model, teacher, opt, x, y, num_old)
        seen += len(y)
    return watch.rate(seen)


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(cfg: BenchConfig, device: torch.device, images: torch.Tensor,
            labels: torch.Tensor, log: Callable[[str], None]) -> tuple[list[LoopResult], LoopResult, int]:
    """Alternate engine (one per precision) and reference rounds; returns the results and batches per round."""
    rows = [(p, True, True) for p in cfg.precisions] + ([(p, False, True) for p in cfg.precisions] if cfg.without_teacher else [])
    rows += [(p, teacher, False) for p, teacher, _ in rows] if cfg.eager else []
    pairs = {row: student_and_teacher(cfg, device) for row in rows}
    ref_model, ref_teacher = student_and_teacher(cfg, device)
    ref_opt = reference_optimizer(ref_model)
    batches_iter = endless(reference_loader(cfg, device, images, labels))
    num_old = cfg.classes // 2
    log("warming up (the engine's first phase includes torch.compile when --compile is given)")
    warm = 0.0
    for (p, with_teacher, graphs), (model, teacher) in pairs.items():
        for _ in range(2):
            rate = engine_epoch_rate(cfg, p, device, model, teacher if with_teacher else None, images, labels, 2,
                                     graphs).wall
            warm = rate if (p, with_teacher, graphs) == rows[0] else warm
    reference_rate(batches_iter, device, ref_model, ref_teacher, ref_opt, 2, num_old)
    batches = max(2, math.ceil(cfg.seconds * warm / cfg.batch_size))
    engines = [LoopResult(f"engine {p}" + (f" ({'bf16' if uses_bf16(p, device) else 'fp32'})" if p == "auto" else "")
                          + ("" if with_teacher else " no teacher") + ("" if graphs else " eager"))
               for p, with_teacher, graphs in rows]
    reference = LoopResult("reference")
    for r in range(cfg.rounds):
        for result, ((p, with_teacher, graphs), (model, teacher)) in zip(engines, pairs.items(), strict=True):
            result.rounds.append(engine_epoch_rate(cfg, p, device, model, teacher if with_teacher else None, images,
                                                   labels, batches, graphs))
        reference.rounds.append(reference_rate(batches_iter, device, ref_model, ref_teacher, ref_opt, batches, num_old))
        rates = ", ".join(f"{e.name} {e.rounds[-1].wall:,.1f}" for e in [*engines, reference])
        log(f"round {r + 1}/{cfg.rounds} ({batches} batches each), img/s: {rates}")
    return engines, reference, batches


# ---------------------------------------------------------------------------------------------
# The paper's schedules
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCost:
    """One step of a schedule: its phases of ``epochs`` each on ``images`` training images."""

    step: int
    phases: int
    epochs: int
    images: int

    @property
    def image_epochs(self) -> int:
        return self.phases * self.epochs * self.images


def paper_schedule(tasks: int, rho: float, classes: int = CIFAR100_CLASSES, train_images: int = CIFAR100_TRAIN,
                   memory: int = PAPER_MEMORY, epochs: int = PAPER_EPOCHS) -> list[StepCost]:
    """The steps of Split-and-Bridge on ``tasks`` equal tasks (docs/method.md §6).

    A later step is split (phases A, B, C) when the partition of a full-width ResNet-18 with its
    C_old and C_total leaves both groups non-empty, else it is one phase (bf = 1).
    """
    per_task_classes, per_class = classes // tasks, train_images // classes
    new_images = per_task_classes * per_class
    steps = [StepCost(1, 1, epochs, new_images)]
    model = create_model("resnet18", per_task_classes, 1.0)
    for t in range(1, tasks):
        num_old = t * per_task_classes
        model.expand_classes(per_task_classes)  # the head the step trains: C_total outputs
        split = make_partition(model, rho, num_old).is_split
        exemplars = min(memory, num_old * per_class)
        steps.append(StepCost(t + 1, 3 if split else 1, epochs, new_images + exemplars))
    return steps


def schedule_rows(rates: dict[str, float]) -> list[dict]:
    """Per paper schedule: epochs, image-epochs and the projected hours at each named rate."""
    rows = []
    for tasks, rho in PAPER_RHO.items():
        steps = paper_schedule(tasks, rho)
        image_epochs = sum(s.image_epochs for s in steps)
        rows.append({"tasks": tasks, "rho": rho, "split_steps": sum(s.phases == 3 for s in steps),
                     "epochs": sum(s.phases * s.epochs for s in steps), "image_epochs": image_epochs,
                     "hours": {name: image_epochs / rate / 3600 for name, rate in rates.items()}})
    return rows


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------


def hardware(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = _cpu_model()
    return f"{model}, {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def format_report(report: dict) -> str:
    """The report as a plain-text table."""
    lines = [
        f"device: {report['hardware']} · torch {report['torch']}",
        f"network: {report['config']['arch']} width {report['config']['width']} · batch {report['config']['batch_size']} · "
        f"{report['config']['image_size']} px · {report['data']} · reference workers {report['reference_workers']}",
        "",
        "Medians over rounds; per CPU-second: images per second of this process's CPU time (all threads),",
        "the steadier measure when other work shares the machine.",
        f"{'loop':<31} {'img/s':>9} {'x ref':>6} {'img/CPU-s':>10} {'x ref':>6}   rounds (img/s)",
    ]
    ref = report["reference"]
    for row in [*report["engines"], ref]:
        lines.append(f"{row['name']:<31} {row['img_s']:>9,.1f} {row['img_s'] / ref['img_s']:>5.2f}x "
                     f"{row['img_per_cpu_s']:>10,.1f} {row['img_per_cpu_s'] / ref['img_per_cpu_s']:>5.2f}x   "
                     + " ".join(f"{r['wall']:,.1f}" for r in row["rounds"]))
    lines += ["", "Projected wall time of the paper's CIFAR-100 schedules at these rates (training only, hours):",
              f"{'tasks':>5} {'rho':>5} {'split':>5} {'epochs':>7} {'image-epochs':>13} "
              + " ".join(f"{name:>14}" for name in report["schedules"][0]["hours"])]
    for row in report["schedules"]:
        lines.append(f"{row['tasks']:>5} {row['rho']:>5} {row['split_steps']:>5} {row['epochs']:>7} {row['image_epochs']:>13,} "
                     + " ".join(f"{h:>14.2f}" for h in row["hours"].values()))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> tuple[BenchConfig, Path | None]:
    """The benchmark's configuration and the optional JSON output path."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--classes", type=int, default=100, help="head size; the teacher's KD covers half")
    p.add_argument("--seconds", type=float, default=20.0, help="target length of each timed measurement")
    p.add_argument("--rounds", type=int, default=3, help="alternating engine/reference rounds")
    p.add_argument("--data", default="auto", choices=("auto", "random", "cifar10"))
    p.add_argument("--images", type=int, default=10_000, help="images to hold (decoded JPEGs or noise)")
    p.add_argument("--workers", type=int, default=-1, help="reference DataLoader workers (-1: 0 on CPU, min(8, cores) on CUDA)")
    p.add_argument("--compile", action="store_true", help="torch.compile the engine's student and teacher")
    p.add_argument("--precision", default="auto",
                   help="engine precision(s), comma-separated: auto (bf16 where the device has native bf16, else fp32), bf16, fp32")
    p.add_argument("--without-teacher", action="store_true",
                   help="also time the engine without a teacher (a first step, CE only), one row per precision")
    p.add_argument("--eager", action="store_true",
                   help="also time every engine row with --no-cuda-graphs (on a GPU: each kernel launched from Python)")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")
    options = vars(p.parse_args(argv))
    json_path = options.pop("json")
    options["precisions"] = tuple(options.pop("precision").split(","))
    return BenchConfig(**options), json_path


def run(cfg: BenchConfig, log: Callable[[str], None]) -> dict:
    """Measure both loops and project the schedules; returns the report as a dict."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device)
    images, labels, described = load_data(cfg)
    log(f"data: {described}")
    engines, reference, batches = measure(cfg, device, images, labels, log)
    return {"config": asdict(cfg), "hardware": hardware(device), "torch": torch.__version__, "data": described,
            "reference_workers": reference_workers(cfg, device), "batches_per_round": batches,
            "engines": [r.to_json() for r in engines], "reference": reference.to_json(),
            "ratios": {r.name: {"wall": r.wall / reference.wall, "cpu": r.cpu / reference.cpu} for r in engines},
            "schedules": schedule_rows({r.name: r.wall for r in [*engines, reference]}),
            "command": " ".join(["python", *sys.argv])}


def main(argv: list[str] | None = None) -> None:
    cfg, json_path = parse_args(argv)
    report = run(cfg, lambda msg: print(msg, file=sys.stderr, flush=True))
    print(format_report(report))
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
