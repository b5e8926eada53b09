"""The pretrained path as a user meets it: a backbone sbcli trained on 50 classes, grown on 50 others.

Tiny-ImageNet-100 at 32 px (``tiny-imagenet-100-32px.zip``): the classes are split once (seed 0) into
50 for the backbone and 50 to grow on. The backbone is ``sb train`` (finetune, one task) on its 50
classes; its top-1 on their test images is printed. The other 50 arrive in 10 tasks of 5, their order
shuffled by each seed, and are learned by:

* ``ranpac``: the ridge head on the frozen backbone (``--method ranpac``);
* ``simplecil``: prototypes on the frozen backbone;
* ``std-ft``: STD + WA fine-tuning the backbone (``--pretrained``), ``--epochs`` a step;
* ``sb-ft``: Split-and-Bridge + WA fine-tuning the backbone, the same epochs a step;
* ``std-scratch``: STD + WA from random weights.

Task 1 is ``api.train``; tasks 2..10 are ``api.add_task`` (what ``sb add-task`` runs), timed around
the call (``add_task_s``; ``step_s`` is the step alone, as the learner records it). Each run starts
with an empty sbcli cache of its own (``SBCLI_CACHE``), as a user's first sequence does: it decodes
its images and, for a frozen backbone, computes its test features once, then reads them back. One JSON line per run on stdout; ``--report FILE`` prints the markdown tables:

    PYTHONPATH=. python benchmarks/pretrained_path.py --data DIR/tiny-imagenet-100-32px.zip --seeds 0 > runs.jsonl
    PYTHONPATH=. python benchmarks/pretrained_path.py --report runs.jsonl

``--grow-data DIR/cifar10-jpeg.zip`` grows the same backbone (still built from ``--data``) on another
data set instead: a zip of class-per-folder images, ``<top>/train/<class>/*`` and ``<top>/test/<class>/*``
(CIFAR-10 as JPEGs, 32 px like the backbone's images). All its classes are grown on, in ``--tasks``
tasks (5 by default there: 2 classes a task for CIFAR-10), their order shuffled by each seed;
``--per-class`` caps the training images of a class, ``--test-per-class`` its test images (all by
default). Each JSON line records the grow data (``grow``), and ``--report`` prints one set of tables
for each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
import zipfile
from pathlib import Path

METHODS = ("ranpac", "simplecil", "std-ft", "sb-ft", "std-scratch")
DEFAULT_GROW = "tiny-imagenet-100-32px.zip"  # the JSON lines without ``grow``: the other half of --data


def class_split(names: list[str]) -> tuple[list[str], list[str]]:
    """(backbone classes, classes to grow on): a fixed half each."""
    order = sorted(names)
    random.Random(0).shuffle(order)
    return sorted(order[: len(order) // 2]), order[len(order) // 2 :]


def members(archive: zipfile.ZipFile) -> list[str]:
    """The image files of a class-per-folder zip: ``<top>/<split>/<class>/<file>``."""
    return [n for n in archive.namelist() if not n.endswith("/") and n.count("/") == 3]


def write_classes(archive: zipfile.ZipFile, names: list[str], classes: list[str], root: Path, per_class: int,
                  test_per_class: int | None = None) -> None:
    for split, limit in (("train", per_class), ("test", test_per_class)):
        for cls in classes:
            folder = root / split / cls
            if folder.is_dir():
                continue
            folder.mkdir(parents=True)
            for member in sorted(n for n in names if n.split("/")[1] == split and n.split("/")[2] == cls)[:limit]:
                (folder / Path(member).name).write_bytes(archive.read(member))


def grow_tasks(archive: zipfile.ZipFile, names: list[str], classes: list[str], root: Path, per_class: int,
               tasks: int, seed: int, test_per_class: int | None = None) -> list[tuple[Path, Path]]:
    """The (train, test) folders of each task under ``root``: ``classes`` in ``seed``'s order, in ``tasks``
    equal parts."""
    order = list(classes)
    random.Random(seed).shuffle(order)
    size = len(order) // tasks
    if size < 1:
        raise SystemExit(f"{tasks} tasks of {len(order)} classes: fewer than one class a task")
    out = []
    for t in range(tasks):
        task = root / f"task{t + 1}"
        write_classes(archive, names, order[t * size : (t + 1) * size], task, per_class, test_per_class)
        out.append((task / "train", task / "test"))
    return out


def build(zip_path: Path, work: Path, per_class: int, tasks: int, seed: int, grow_zip: Path | None = None,
          test_per_class: int | None = None) -> tuple[Path, list[tuple[Path, Path]]]:
    """The backbone's folder and, for ``seed``, the (train, test) folders of each task to grow on: the other
    half of ``zip_path``'s classes, or every class of ``grow_zip``."""
    with zipfile.ZipFile(zip_path) as archive:
        names = members(archive)
        backbone, grow = class_split(sorted({n.split("/")[2] for n in names}))
        write_classes(archive, names, backbone, work / "backbone", per_class)
        if grow_zip is None:
            root = work / (f"grow-s{seed}" if test_per_class is None else f"grow-s{seed}-t{test_per_class}")
            return work / "backbone", grow_tasks(archive, names, grow, root, per_class, tasks, seed, test_per_class)
    with zipfile.ZipFile(grow_zip) as archive:
        names = members(archive)
        classes = sorted({n.split("/")[2] for n in names})
        # the folder names what decides its contents, so a run with other caps never reuses it
        root = work / f"grow-{Path(grow_zip).stem}-n{per_class}-t{test_per_class or 'all'}-s{seed}"
        return work / "backbone", grow_tasks(archive, names, classes, root, per_class, tasks, seed, test_per_class)


def pretrain(folder: Path, out: Path, args: argparse.Namespace) -> dict:
    from sbcli import api
    from sbcli.engine.loop import TrainConfig

    if not (out / "learner.json").is_file():
        train = TrainConfig(epochs=args.pretrain_epochs, batch_size=64, lr=0.05, threads=args.threads, warmup_epochs=1.0)
        run = api.RunOptions(method="finetune", arch=args.arch, width=args.width, train=train, memory=0, seed=0,
                             device="cpu")
        seq = api.SequenceOptions(source=str(folder / "train"), test=str(folder / "test"), image_size=32, tasks=1)
        api.train(seq, run, out)
    history = json.loads((out / "learner.json").read_text())["history"]
    return {"backbone_top1": history[0]["metrics"]["overall"], "backbone": str(out.name)}


def run_options(name: str, backbone: Path, args: argparse.Namespace, seed: int):
    from sbcli import api
    from sbcli.engine.loop import TrainConfig

    train = TrainConfig(epochs=args.epochs, batch_size=64, lr=args.lr, threads=args.threads, warmup_epochs=0.0)
    common = {"arch": args.arch, "width": args.width, "train": train, "seed": seed, "device": "cpu"}
    if name in ("ranpac", "simplecil"):
        return api.RunOptions(method=name, memory=0, pretrained=str(backbone), **common)
    method = "sb" if name == "sb-ft" else "std"
    options = {"inference": "wa", "wa_clip": True} if method == "std" else {"inference": "wa"}
    if method == "sb":
        options = {**options, "epochs_a": max(1, args.epochs * 4 // 10), "epochs_b": max(1, args.epochs * 3 // 10),
                   "epochs_c": max(1, args.epochs * 3 // 10)}
    return api.RunOptions(method=method, memory=args.memory, method_options=options,
                          pretrained=None if name == "std-scratch" else str(backbone), **common)


def run_one(name: str, backbone: Path, tasks: list[tuple[Path, Path]], out: Path, args: argparse.Namespace,
            seed: int) -> dict:
    from sbcli import api
    from sbcli.learner.records import StepRecord
    from sbcli.metrics import history_summary

    (train1, test1), later = tasks[0], tasks[1:]
    os.environ["SBCLI_CACHE"] = str(out.with_name(out.name + "-cache"))  # empty: the run fills its own
    start = time.perf_counter()
    api.train(api.SequenceOptions(source=str(train1), test=str(test1), image_size=32, tasks=1),
              run_options(name, backbone, args, seed), out)
    first = time.perf_counter() - start
    add_seconds = []
    for train_dir, test_dir in later:
        start = time.perf_counter()
        api.add_task(out, train_dir, test_dir, device="cpu")
        add_seconds.append(round(time.perf_counter() - start, 2))
    history = json.loads((out / "learner.json").read_text())["history"]
    settings = ("arch", "width", "epochs", "lr", "memory", "per_class", "test_per_class", "tasks")
    return {"method": name, "seed": seed, "grow": grow_name(args),
            "summary": history_summary([StepRecord.from_json(h) for h in history]).to_json(),
            "overall": [h["metrics"]["overall"] for h in history], "first_task_s": round(first, 2),
            "add_task_s": add_seconds, "step_s": [h["seconds"] for h in history[1:]], "settings": {k: getattr(args, k) for k in settings}}


def grow_name(args: argparse.Namespace) -> str:
    return Path(args.grow_data).name if args.grow_data else DEFAULT_GROW


def report(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    runs = [r for r in rows if "method" in r]
    for top1 in dict.fromkeys(r["backbone_top1"] for r in rows if "backbone_top1" in r):
        print(f"Backbone: top-1 {top1:.1f} % on its own 50 classes.\n")
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in runs:  # runs grown on other data, or in another number of tasks, never share a table
        groups.setdefault((r.get("grow", DEFAULT_GROW), len(r["overall"])), []).append(r)
    for i, ((grow, tasks), mine) in enumerate(groups.items()):
        if grow != DEFAULT_GROW or len(groups) > 1:
            print(("\n" if i else "") + f"Grown on {grow} in {tasks} tasks:\n")
        report_tables(mine)


def report_tables(runs: list[dict]) -> None:
    def cell(values: list[float]) -> str:
        return f"{statistics.mean(values):.1f} ({min(values):.1f}-{max(values):.1f})" if len(values) > 1 else f"{values[0]:.1f}"

    def step(mine: list[dict]) -> str:  # runs from before the step's own seconds were recorded have none
        return cell([statistics.median(r["step_s"]) for r in mine]) if all(r.get("step_s") for r in mine) else "-"

    print("| method | seeds | avg 1..T | last | `add-task` s (median of tasks 2..T) | the step alone s |")
    print("|---|---|---|---|---|---|")
    for name in METHODS:
        mine = [r for r in runs if r["method"] == name]
        if mine:
            print(f"| {name} | {len(mine)} | {cell([r['summary']['avg_incremental_1_to_T'] for r in mine])} | "
                  f"{cell([r['summary']['last'] for r in mine])} | {cell([statistics.median(r['add_task_s']) for r in mine])} "
                  f"| {step(mine)} |")
    print("\n| method | seed | accuracy after each step |\n|---|---|---|")
    for r in sorted(runs, key=lambda r: (METHODS.index(r["method"]), r["seed"])):
        print(f"| {r['method']} | {r['seed']} | {' / '.join(f'{a:.1f}' for a in r['overall'])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="tiny-imagenet-100-32px.zip (the backbone's classes)")
    parser.add_argument("--grow-data", type=Path,
                        help="grow on every class of this zip (cifar10-jpeg.zip) instead of the other half of --data")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--width", type=float, default=0.25)
    parser.add_argument("--per-class", type=int, default=200, help="training images of each class")
    parser.add_argument("--test-per-class", type=int, help="test images of each grown class (default: all)")
    parser.add_argument("--tasks", type=int, help="tasks to grow in (default: 10, or 5 with --grow-data)")
    parser.add_argument("--pretrain-epochs", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=10, help="the trained rows: epochs a step")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--memory", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "sbcli-pretrained-path")
    parser.add_argument("--report", type=Path, help="print the tables of a JSON-lines file of earlier runs and exit")
    args = parser.parse_args()
    if args.report:
        report(args.report)
        return
    if args.data is None:
        parser.error("--data is required (the tiny-imagenet-100-32px.zip)")
    if args.tasks is None:
        args.tasks = 5 if args.grow_data else 10
    args.work.mkdir(parents=True, exist_ok=True)
    backbone_dir = args.work / "backbone-learner"
    for seed in args.seeds:
        folder, tasks = build(args.data, args.work, args.per_class, args.tasks, seed, args.grow_data,
                              args.test_per_class)
        if seed == args.seeds[0]:
            print(json.dumps(pretrain(folder, backbone_dir, args)), flush=True)
        for name in args.methods:
            out = args.work / "runs" / f"{name}-s{seed}-{time.time_ns()}"
            print(json.dumps(run_one(name, backbone_dir, tasks, out, args, seed)), flush=True)


if __name__ == "__main__":
    main()
