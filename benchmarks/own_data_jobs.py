"""The runs of the own-data measurements ("good accuracy on a user's own images"), as `sb` command lines.

benchmarks/own_data_gpu.py runs them in parallel on one GPU (or, with ``--dry``, tiny on the CPU).
Each :class:`Job` is one `sb` command; ``after`` names a job that must have succeeded first.
The groups (docs/lab/benchmarks.md, "Own data at small budgets"):

- ``retain``: keeping the old classes: the first 50 classes of the 32 px Tiny-ImageNet-100,
  250 images a class, 10 tasks of 5, ResNet-18 x0.25, 5 epochs a phase, memory 500, 3 seeds, for
  the variants in :data:`RETAIN_VARIANTS`.
- ``warmup``: the collapse configuration: the first 20 classes, 250 a class, 4 tasks of
  5, ResNet-32, batch 128, lr 0.1, 10 epochs a step (S&B phases 4,3,3), memory 500, with and
  without warm-up; ``val``: the same with ``--val-fraction 0.1``.
- ``pretrain``/``push``/``cifar``: a ResNet-18 trained on all 100 Tiny-ImageNet-100 classes (32 px),
  pushed with `sb export --to-hub`, then CIFAR-10 at 500 images a class in 5 tasks from it
  (``--pretrained``) and from scratch, with the folder defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

HUB_REPO = "sbcli-bench/tiny-imagenet-100-resnet18"
SEEDS = (0, 1, 2)
BALANCE = "{balance}"  # --balance-epochs, filled in from Sizes.balance

# name -> extra `sb train` options on top of the retain configuration
RETAIN_VARIANTS: dict[str, list[str]] = {
    "sb": [],
    "std": ["--method", "std"],
    "sb-balance": ["--balance-epochs", BALANCE],
    "sb-inclr": ["--incremental-lr", "0.01"],
    "sb-inclr-balance": ["--incremental-lr", "0.01", "--balance-epochs", BALANCE],
    "std-balance": ["--method", "std", "--balance-epochs", BALANCE],
    "std-inclr-balance": ["--method", "std", "--incremental-lr", "0.01", "--balance-epochs", BALANCE],
    "sb-mem2000": ["--memory", "2000"],
    "sb-mem2000-balance": ["--memory", "2000", "--balance-epochs", BALANCE],
}
RETAIN_FIRST = ("sb", "sb-balance", "sb-inclr-balance", "std")  # run before the other variants


# `sb export --to-hub` (the learner, its ONNX model and card); should the ONNX export fail on the
# device's packages, the weights alone with huggingface_hub, so that the CIFAR runs still have them
PUSH = """
import subprocess, sys
from pathlib import Path
code = subprocess.call([sys.executable, "-m", "sbcli", "export", "{learner}", "--to-hub", "{repo}", "--quiet"])
if code != 0:
    import json
    from huggingface_hub import HfApi
    root = Path("{learner}")
    model = root / json.loads((root / "learner.json").read_text())["files"]["model"]
    api = HfApi()
    api.create_repo("{repo}", exist_ok=True)
    api.upload_file(path_or_fileobj=str(model), path_in_repo="model.safetensors", repo_id="{repo}")
    print("sb export --to-hub failed; pushed model.safetensors alone with huggingface_hub")
"""


@dataclass
class Job:
    name: str
    group: str
    args: list[str]  # after `python -m sbcli`
    out: Path | None = None  # the learner it writes (read back for the results)
    after: str | None = None
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Folders:
    """The class-per-folder trees the jobs read (made by own_data_gpu.prepare)."""

    retain: Path  # 50 classes x 250 (+ test)
    warmup: Path  # 20 classes x 250 (+ test)
    tiny: Path  # all 100 classes, 500 a class (+ test)
    cifar: Path  # CIFAR-10, 500 a class (+ the whole test set)


@dataclass(frozen=True)
class Sizes:
    """Budgets: the real ones, or tiny ones for ``--dry``."""

    retain_epochs: int = 5
    retain_tasks: int = 10
    warmup_epochs: int = 10
    warmup_phases: str = "4,3,3"
    pretrain_epochs: int = 30
    pretrain_batch: int = 256
    pretrain_lr: float = 0.1
    cifar_epochs: int | None = None  # None: the folder default (30)
    balance: str = "3"


DRY = Sizes(retain_epochs=1, retain_tasks=3, warmup_epochs=1, warmup_phases="1,1,1", pretrain_epochs=1, cifar_epochs=1,
            balance="1")


def train(folder: Path, out: Path, *options: str) -> list[str]:
    """An `sb train` line as these runs were measured: balancing only where ``options`` ask for it (before
    ``--balance-epochs 2`` became the own-data default), S&B unless another method is named, and STD + WA
    clipping the head in step 1 only (before a folder's default became STD + WA with ``--wa-clip``)."""
    balance = [] if "--balance-epochs" in options else ["--balance-epochs", "0"]
    method = [] if "--method" in options else ["--method", "sb"]
    clip = ["--no-wa-clip"] if "std" in options and "--inference" not in options else []
    return ["train", str(folder / "train"), "--test", str(folder / "test"), "--out", str(out), "--json", "--quiet",
            "--device", "auto", *options, *balance, *method, *clip]


def jobs(f: Folders, runs: Path, s: Sizes = Sizes()) -> list[Job]:
    """Every run, most important first."""

    def retain(variant: str, seed: int) -> Job:
        extra = [a.format(balance=s.balance) for a in RETAIN_VARIANTS[variant]]
        out = runs / f"retain-{variant}-s{seed}"
        return Job(out.name, "retain", train(f.retain, out, "--tasks", str(s.retain_tasks), "--arch", "resnet18",
                                             "--width", "0.25", "--epochs", str(s.retain_epochs), "--batch-size", "128",
                                             "--lr", "0.1", "--memory", "500", "--seed", str(seed), *extra), out,
                   info={"variant": variant, "seed": seed})

    def collapse(variant: str, seed: int, *extra: str) -> Job:
        out = runs / f"{variant}-s{seed}"
        group = "val" if variant.startswith("val") else "warmup"
        return Job(out.name, group, train(f.warmup, out, "--tasks", "4", "--arch", "resnet32", "--epochs",
                                          str(s.warmup_epochs), "--phase-epochs", s.warmup_phases, "--batch-size", "128",
                                          "--lr", "0.1", "--memory", "500", "--seed", str(seed), *extra), out,
                   info={"variant": variant, "seed": seed})

    def cifar(variant: str, seed: int, *extra: str) -> Job:
        out = runs / f"cifar-{variant}-s{seed}"
        epochs = [] if s.cifar_epochs is None else ["--epochs", str(s.cifar_epochs)]
        return Job(out.name, "cifar", train(f.cifar, out, "--tasks", "5", "--seed", str(seed), *epochs, *extra), out,
                   after="push" if "--pretrained" in extra else None, info={"variant": variant, "seed": seed})

    pre = runs / "pretrain"
    out = [Job("pretrain", "pretrain", train(f.tiny, pre, "--tasks", "1", "--epochs", str(s.pretrain_epochs),
                                             "--batch-size", str(s.pretrain_batch), "--lr", str(s.pretrain_lr),
                                             "--memory", "0", "--no-test-sample"), pre),
           Job("push", "push", ["-c", PUSH.format(learner=str(pre), repo=HUB_REPO)], after="pretrain")]
    out += [retain(v, seed) for v in RETAIN_FIRST for seed in SEEDS]
    out += [collapse(v, seed, *x) for seed in SEEDS for v, x in (("warmup-off", ("--warmup-epochs", "0")), ("warmup-on", ()))]
    out += [cifar(v, seed, *x) for seed in SEEDS for v, x in (("pretrained", ("--pretrained", HUB_REPO)), ("scratch", ()))]
    out += [retain(v, seed) for v in RETAIN_VARIANTS if v not in RETAIN_FIRST for seed in SEEDS]
    out += [collapse("val-0.1", seed, "--val-fraction", "0.1") for seed in SEEDS]
    out += [cifar(v, seed, *x) for seed in SEEDS
            for v, x in (("pretrained-balance", ("--pretrained", HUB_REPO, "--balance-epochs", s.balance)),
                         ("scratch-balance", ("--balance-epochs", s.balance)))]
    return out
