"""S&B + WA against STD + WA: the same real images, task split, network and budget, over several seeds.

For each task count and seed, both methods are trained with :func:`sbcli.api.train` from the same
initial weights (the seed fixes them) on the same class order (``--order-seed``), and the average
incremental accuracy over steps 2..T (the paper's Table 1 metric) is printed per run, then as mean
and sample standard deviation over seeds, with the paired per-seed difference S&B - STD.

The data is a small, CPU-sized cut of the 100-class Tiny-ImageNet subset (``--data``): its first
``--classes`` classes (sorted wnids), ``--per-class`` training images each and all 50 val images,
resized to ``--image-size`` px. The cut is written once as a class-per-folder tree of PNGs under
``--work`` (nothing goes into the repository) and read back through the ordinary folder source.
Runs are learner directories under ``--work/runs``: an interrupted benchmark continues where it
stopped when run again with the same options.

Example (the run of docs/lab/benchmarks.md; a 2-core CPU, no GPU):

    nice -n 10 python benchmarks/sb_vs_std.py --classes 20 --per-class 100 --tasks 2 5 --seeds 0 1 2 \\
        --epochs 5 --batch-size 32 --precision fp32 --json /tmp/sb-vs-std.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from sbcli import api
from sbcli.data.imageset import ImageSet
from sbcli.data.sources import DecodeCache, load_tiny_imagenet
from sbcli.engine.loop import TrainConfig
from sbcli.learner.state import read_state
from sbcli.metrics import average_incremental

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from realdata import archive_path  # noqa: E402  (the one data setting: $SBCLI_TEST_DATA)

DEFAULT_DATA = archive_path("tiny-imagenet-100.zip")
TINY_RHO = {2: 1.0, 5: 1.35, 10: 1.2, 20: 1.113}  # docs/method.md §6, Tiny-ImageNet column
LABELS = {"std": "STD + WA", "std-long": "STD + WA (long steps)", "sb": "S&B + WA"}


@dataclass(frozen=True)
class Cut:
    """Which part of the dataset the benchmark uses."""

    data: Path
    classes: int
    per_class: int
    image_size: int

    def folder(self, work: Path) -> Path:
        return work / f"data-c{self.classes}-n{self.per_class}-s{self.image_size}"


def first_per_class(images: ImageSet, classes: int, per_class: int | None) -> ImageSet:
    """The first ``per_class`` images (in dataset order) of each of the first ``classes`` classes."""
    keep: list[torch.Tensor] = []
    for c in range(classes):
        idx = (images.labels == c).nonzero().flatten()
        keep.append(idx if per_class is None else idx[:per_class])
    return images.subset(torch.cat(keep))


def resized(images: torch.Tensor, size: int) -> torch.Tensor:
    """Antialiased bilinear resize of uint8 images [N, 3, H, W]."""
    if images.shape[-1] == size:
        return images
    out = torch.nn.functional.interpolate(images.float(), size=(size, size), mode="bilinear", antialias=True)
    return out.round().clamp(0, 255).to(torch.uint8)


def write_folder(images: ImageSet, root: Path) -> None:
    """A class-per-folder tree of PNGs; folders are numbered so that their sorted order is the label order."""
    for c, name in enumerate(images.class_names):
        idx = (images.labels == c).nonzero().flatten()
        if len(idx) == 0:
            continue
        folder = root / f"{c:03d}-{name.replace('/', '-')}"
        folder.mkdir(parents=True, exist_ok=True)
        for j, i in enumerate(idx.tolist()):
            Image.fromarray(images.images[i].permute(1, 2, 0).numpy()).save(folder / f"{j:04d}.png")


def prepare(cut: Cut, work: Path) -> tuple[Path, Path]:
    """Write the cut once (train and test folders); later runs reuse it."""
    root = cut.folder(work)
    done = root / "READY"
    if not done.is_file():
        cache = DecodeCache.default()
        for split, per_class in (("train", cut.per_class), ("test", None)):
            full = load_tiny_imagenet(cut.data, split == "train", cache=cache)
            part = first_per_class(full, cut.classes, per_class)
            write_folder(ImageSet(resized(part.images, cut.image_size), part.labels, part.class_names), root / split)
        done.write_text("ok\n")
    return root / "train", root / "test"


def sb_options(tasks: int, args: argparse.Namespace) -> dict:
    """rho (the paper's Tiny-ImageNet value for the task count unless given) and the phase epochs."""
    options: dict = {"rho": args.rho or TINY_RHO.get(tasks, 1.0)}
    if args.sb_phase_epochs:
        a, b, c = (int(v) for v in args.sb_phase_epochs.split(","))
        options |= {"epochs_a": a, "epochs_b": b, "epochs_c": c}
    return options


def check_budget(args: argparse.Namespace) -> None:
    """Refuse to mix runs of another budget into the same work directory."""
    keys = ("data", "classes", "per_class", "image_size", "order_seed", "width", "epochs", "sb_phase_epochs",
            "batch_size", "lr", "memory", "rho", "precision")
    budget = {k: str(getattr(args, k)) for k in keys}
    path = args.work / "runs" / "budget.json"
    if path.is_file() and json.loads(path.read_text()) != budget:
        sys.exit(f"{args.work} holds runs of another budget ({path}); pass another --work.")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(budget, indent=1))


class _FirstStepDone(Exception):
    """Raised after step 1 to change the epochs of the later steps (``--std-step-epochs``)."""


def _stop(_step: object) -> None:
    raise _FirstStepDone


def set_later_epochs(out: Path, epochs: int) -> None:
    """Edit the saved learner's epochs, which its later steps train with (the learner format is JSON)."""
    path = out / "learner.json"
    state = json.loads(path.read_text(encoding="utf-8"))
    state["train_config"]["epochs"] = epochs
    path.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")


def run_one(method: str, tasks: int, seed: int, folders: tuple[Path, Path], args: argparse.Namespace) -> list[float]:
    """Train (or finish) one learner; its per-step overall accuracies.

    ``std-long`` is STD + WA whose steps 2..T train ``--std-step-epochs`` epochs (step 1 as the others).
    """
    tag = f"{method}{args.std_step_epochs}" if method == "std-long" else method
    out = args.work / "runs" / f"{tag}-T{tasks}-seed{seed}"
    if (out / "learner.json").is_file() and read_state(out).steps == tasks:
        return [h.metrics.overall for h in read_state(out).history]
    options = {"inference": "wa"} | (sb_options(tasks, args) if method == "sb" else {})
    seq = api.SequenceOptions(source=str(folders[0]), test=str(folders[1]), image_size=args.image_size, tasks=tasks,
                              order_seed=args.order_seed)
    train = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, precision=args.precision)
    run = api.RunOptions(method=method.removesuffix("-long"), method_options=options, arch="resnet18",
                         width=args.width, train=train, memory=args.memory or 20 * args.classes, selection="random",
                         seed=seed, device="cpu")
    torch.manual_seed(seed)  # the initial weights: the same for every method of a seed
    start = time.perf_counter()
    if method == "std-long" and not (out / "learner.json").is_file():
        try:
            api.train(seq, run, out, on_step=_stop)
        except _FirstStepDone:
            set_later_epochs(out, args.std_step_epochs)
    learner = api.train(seq, run, out, resume=(out / "learner.json").is_file())
    print(f"  {method:8s} T={tasks:<3d} seed {seed}: {time.perf_counter() - start:7.1f} s", file=sys.stderr, flush=True)
    return [h.metrics.overall for h in learner.state.history]


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):6.2f} ± {sd:5.2f}"


def report(results: dict, seeds: list[int]) -> str:
    """A Markdown table: per task count, each method's per-seed values, mean ± sd, and the paired difference."""
    lines = ["| tasks | method | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± sd |",
             "|---|---|" + "---|" * len(seeds) + "---|"]
    for tasks, by_method in results.items():
        avg = {m: [average_incremental(acc, skip_first=True) for acc in runs] for m, runs in by_method.items()}
        for method in by_method:
            cells = " | ".join(f"{v:.2f}" for v in avg[method])
            lines.append(f"| {tasks} | {LABELS[method]} | {cells} | {mean_sd(avg[method])} |")
        for method in (m for m in by_method if m != "sb"):
            diff = [b - a for a, b in zip(avg[method], avg["sb"], strict=True)]
            name = "S&B - STD" + (" (long steps)" if method == "std-long" else "")
            lines.append(f"| {tasks} | {name} | " + " | ".join(f"{d:+.2f}" for d in diff) + f" | {mean_sd(diff)} |")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Tiny-ImageNet zip or folder")
    p.add_argument("--classes", type=int, default=20, help="use the first N classes (sorted wnids)")
    p.add_argument("--per-class", type=int, default=100, help="training images per class")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--tasks", type=int, nargs="+", default=[2, 5])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--order-seed", type=int, default=0, help="class order: the same for every run")
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--epochs", type=int, default=5, help="epochs of every phase (step 1, STD, and S&B's A, B, C)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--memory", type=int, default=None, help="exemplar budget (default 20 per class, as 2000/100)")
    p.add_argument("--rho", type=float, default=None, help="default: the paper's Tiny-ImageNet rho for the task count")
    p.add_argument("--sb-phase-epochs", default=None,
                   help="S&B's phases A,B,C (default: --epochs each, the paper's protocol); e.g. with --epochs 15, "
                        "5,5,5 gives both methods the same epochs per step")
    p.add_argument("--std-step-epochs", type=int, default=None,
                   help="also run STD + WA with this many epochs in steps 2..T (e.g. 3 x --epochs: S&B's epochs "
                        "per split step), a control for S&B's longer training")
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                   help="training precision, as sb train --precision (docs/lab/benchmarks.md's runs: fp32)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: fastest on a shared CPU)")
    p.add_argument("--work", type=Path, default=Path("/tmp/sb-vs-std"))
    p.add_argument("--json", type=Path, default=None, help="also write every per-step accuracy here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if not args.data.exists():
        sys.exit(f"{args.data} does not exist; pass --data (the Tiny-ImageNet zip or folder).")
    torch.set_num_threads(args.threads)
    check_budget(args)
    start = time.perf_counter()
    folders = prepare(Cut(args.data, args.classes, args.per_class, args.image_size), args.work)
    methods = ("std", "sb") if args.std_step_epochs is None else ("std", "std-long", "sb")
    results = {t: {m: [run_one(m, t, s, folders, args) for s in args.seeds] for m in methods} for t in args.tasks}
    print(report(results, args.seeds))
    print(f"\nwall time {time.perf_counter() - start:.0f} s; torch {torch.__version__}, {args.threads} thread(s)")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1))


if __name__ == "__main__":
    main()
