"""SimpleCIL against Split-and-Bridge on CIFAR-10 in 5 tasks, from a backbone sbcli pretrained itself.

The backbone is an sbcli learner trained on other classes (docs/lab/benchmarks.md says which run). Its
weights, less the head, are written once to ``--work``/backbone.safetensors and given as
``--pretrained`` to two of the three runs of every seed:

* ``simplecil``: prototypes on the frozen backbone (no training, no exemplars);
* ``sb-pretrained``: Split-and-Bridge fine-tuning that backbone;
* ``sb-scratch``: Split-and-Bridge from random weights.

Each run learns task 1 with ``api.train`` and tasks 2..5 with ``api.add_task`` (what ``sb add-task``
runs), whose wall seconds are measured around the call. The CIFAR-10 images are copied once from
the zip into class-per-folder trees (the first ``--per-class`` training and ``--test-per-class`` test
images of each class); the class order is shuffled by the seed. One JSON line per run on stdout;
``--report FILE.jsonl`` prints the markdown table of docs/lab/benchmarks.md from those lines:

    PYTHONPATH=. python benchmarks/simplecil_cifar10.py --tiny-folder /tmp/tin100-n100   # prints the `sb train` of the backbone
    PYTHONPATH=. python benchmarks/simplecil_cifar10.py --backbone /path/to/tiny-learner --seeds 0 1 2 > runs.jsonl
    PYTHONPATH=. python benchmarks/simplecil_cifar10.py --report runs.jsonl

With network access, ``--arch timm/resnet18.a1_in1k`` (or a timm ViT) runs SimpleCIL on ImageNet
weights instead, at the backbone's own resolution (the S&B runs need an sbcli ResNet: ``--methods
simplecil``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
import zipfile
from pathlib import Path

ZIP = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "cifar10-jpeg.zip"
TINY_ZIP = ZIP.parent / "tiny-imagenet-100-32px.zip"
PRETRAIN = ("sb train {root}/train --test {root}/test --tasks 1 --method finetune --memory 0 --arch resnet18 --width 0.5 "
            "--epochs 2 --batch-size 64 --warmup-epochs 0.25 --milestones 0.75 --threads 1 --order-seed -1 --seed 0 "
            "-o {out}")
METHODS = ("simplecil", "sb-pretrained", "sb-scratch")


def build_tasks(zip_path: Path, root: Path, per_class: int, test_per_class: int, seed: int, tasks: int) -> list[tuple[Path, Path]]:
    """(train, test) class-per-folder trees of each task, the class order shuffled by ``seed``."""
    with zipfile.ZipFile(zip_path) as archive:
        names = [n for n in archive.namelist() if n.endswith(".jpg")]
        classes = sorted({n.split("/")[2] for n in names})
        order = list(classes)
        random.Random(seed).shuffle(order)
        per_task = len(order) // tasks
        out = []
        for t in range(tasks):
            task_root = root / f"seed{seed}" / f"task{t + 1}"
            for split, limit in (("train", per_class), ("test", test_per_class)):
                for cls in order[t * per_task : (t + 1) * per_task]:
                    folder = task_root / split / cls
                    if folder.is_dir():
                        continue
                    folder.mkdir(parents=True)
                    members = sorted(n for n in names if n.split("/")[1] == split and n.split("/")[2] == cls)[:limit]
                    for member in members:
                        (folder / Path(member).name).write_bytes(archive.read(member))
            out.append((task_root / "train", task_root / "test"))
    return out


def backbone_file(learner_dir: Path, work: Path) -> Path:
    """The learner's weights less its head, as safetensors (what ``--pretrained FILE`` reads)."""
    from safetensors.torch import save_file

    from sbcli.learner.state import Learner

    path = work / "backbone.safetensors"
    if not path.is_file():
        learner = Learner.load(learner_dir, "cpu")
        save_file({k: v.contiguous() for k, v in learner.model.state_dict().items() if not k.startswith("head.")},
                  str(path))
    return path


def run_one(name: str, tasks: list[tuple[Path, Path]], out: Path, args: argparse.Namespace, seed: int,
            weights: Path | None) -> dict:
    from sbcli import api
    from sbcli.engine.loop import TrainConfig

    train = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, threads=1, warmup_epochs=0.0)
    if name == "simplecil":
        run = api.RunOptions(method="simplecil", arch=args.arch, width=1.0 if args.arch.startswith("timm/") else args.width,
                             train=train, memory=0, seed=seed, device="cpu", pretrained=None if args.arch.startswith("timm/") else str(weights))
    else:
        run = api.RunOptions(method="sb", arch=args.arch, width=args.width, train=train, memory=args.memory, seed=seed,
                             device="cpu", pretrained=str(weights) if name == "sb-pretrained" else None)
    (train1, test1), later = tasks[0], tasks[1:]
    start = time.perf_counter()
    seq = api.SequenceOptions(source=str(train1), test=str(test1), image_size=None if args.arch.startswith("timm/") else 32,
                              tasks=1)
    api.train(seq, run, out)
    first = time.perf_counter() - start
    add_seconds = []
    for train_dir, test_dir in later:
        start = time.perf_counter()
        api.add_task(out, train_dir, test_dir, device="cpu")
        add_seconds.append(round(time.perf_counter() - start, 2))
    state = json.loads((out / "learner.json").read_text())
    history = state["history"]
    from sbcli.learner.records import StepRecord
    from sbcli.metrics import history_summary

    last = history[-1]["metrics"]
    return {"method": name, "seed": seed, "summary": history_summary([StepRecord.from_json(h) for h in history]).to_json(), "last_old": last["old"],
            "last_new": last["new"], "overall": [h["metrics"]["overall"] for h in history],
            "first_task_s": round(first, 2), "add_task_s": add_seconds,
            "pretrained": state.get("provenance", {}).get("pretrained"),
            "settings": {"arch": args.arch, "width": args.width, "epochs": args.epochs, "batch_size": args.batch_size,
                         "lr": args.lr, "memory": run.memory, "per_class": args.per_class,
                         "test_per_class": args.test_per_class}}


def report(path: Path) -> None:
    """The markdown table of the runs in a JSON-lines file: mean (min-max) over seeds."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def cell(values: list[float]) -> str:
        return f"{statistics.mean(values):.1f} ({min(values):.1f}-{max(values):.1f})" if len(values) > 1 else f"{values[0]:.1f}"

    print("| method | seeds | avg. incremental (2..5) | last step | last: old | last: new | `add-task` s (mean of tasks 2-5) |")
    print("|---|---|---|---|---|---|---|")
    for name in METHODS:
        runs = [r for r in rows if r["method"] == name]
        if not runs:
            continue
        print(f"| {name} | {len(runs)} | {cell([r['summary']['avg_incremental_2_to_T'] for r in runs])} | "
              f"{cell([r['summary']['last'] for r in runs])} | {cell([r['last_old'] for r in runs])} | "
              f"{cell([r['last_new'] for r in runs])} | {cell([statistics.mean(r['add_task_s']) for r in runs])} |")
    print()
    print("| method | seed | accuracy after steps 1..5 | `add-task` s, tasks 2..5 | first task s |")
    print("|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (METHODS.index(r["method"]), r["seed"])):
        print(f"| {r['method']} | {r['seed']} | {' / '.join(f'{a:.1f}' for a in r['overall'])} | "
              f"{' / '.join(f'{t:.1f}' for t in r['add_task_s'])} | {r['first_task_s']:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", type=Path, help="an sbcli learner directory whose network is the backbone")
    parser.add_argument("--arch", default="resnet18", help="the backbone's architecture (timm/NAME: SimpleCIL alone)")
    parser.add_argument("--width", type=float, default=0.5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--per-class", type=int, default=100, help="training images of each CIFAR-10 class")
    parser.add_argument("--test-per-class", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=2, help="S&B: epochs of every phase")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--memory", type=int, default=100, help="S&B: exemplar budget")
    parser.add_argument("--zip", type=Path, default=ZIP)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "sbcli-simplecil-cifar10")
    parser.add_argument("--report", type=Path, help="print the table of a JSON-lines file of earlier runs and exit")
    parser.add_argument("--tiny-folder", type=Path, help="write the backbone's training folders (the first "
                        "--tiny-per-class images of each Tiny-ImageNet-100 32 px class) here, print its `sb train`, exit")
    parser.add_argument("--tiny-per-class", type=int, default=100)
    args = parser.parse_args()
    if args.report:
        report(args.report)
        return
    if args.tiny_folder:
        from small_budget import build_folder

        build_folder(TINY_ZIP, args.tiny_folder, 100, args.tiny_per_class)
        print(PRETRAIN.format(root=args.tiny_folder, out=args.tiny_folder.parent / "tiny-backbone"))
        return

    import torch

    torch.set_num_threads(1)
    args.work.mkdir(parents=True, exist_ok=True)
    weights = backbone_file(args.backbone, args.work) if args.backbone else None
    for seed in args.seeds:
        tasks = build_tasks(args.zip, args.work / "data", args.per_class, args.test_per_class, seed, 5)
        for name in args.methods:
            out = args.work / "runs" / f"{name}-s{seed}-{time.time_ns()}"
            print(json.dumps(run_one(name, tasks, out, args, seed, weights)), flush=True)


if __name__ == "__main__":
    main()
