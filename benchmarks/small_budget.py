"""Small-budget runs on the first 20 classes of the Tiny-ImageNet-100 32 px subset.

The configuration: 250 training images a class (the first 250 file names of each
class), the 50 test images a class, 20 classes (the first 20 wnids in sorted order) in 4 tasks of
5, ResNet-32, batch 128, lr 0.1. ``--init paper`` is the paper's schedule and init (no warm-up,
BN scales at 1); ``--init stable`` is one epoch of linear warm-up per phase and zero-initialised
last BN of each residual block (the own-data default). One JSON line per run on stdout:

    PYTHONPATH=. python benchmarks/small_budget.py --seed 0 --init paper
    PYTHONPATH=. python benchmarks/small_budget.py --seed 0 --init stable --warmup-epochs 1
    PYTHONPATH=. python benchmarks/small_budget.py --seed 1 --init paper --steps 1   # the first task alone

The images are copied (as their WebP bytes) into a class-per-folder tree under --work (outside
the repository) once.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from realdata import archive_path  # noqa: E402  (the one data setting: $SBCLI_TEST_DATA)

ZIP = archive_path("tiny-imagenet-100-32px.zip")


def build_folder(zip_path: Path, root: Path, classes: int, per_class: int) -> tuple[Path, Path]:
    """train/ and test/ class-per-folder trees with the first ``classes`` wnids, ``per_class`` train images each."""
    train, test = root / "train", root / "test"
    if (root / "done").is_file():
        return train, test
    with zipfile.ZipFile(zip_path) as archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
        wnids = sorted({n.split("/")[2] for n in names if n.split("/")[1] == "train"})[:classes]
        for split, out, limit in (("train", train, per_class), ("test", test, None)):
            for wnid in wnids:
                members = sorted(n for n in names if n.split("/")[1] == split and n.split("/")[2] == wnid)[:limit]
                (out / wnid).mkdir(parents=True, exist_ok=True)
                for member in members:
                    (out / wnid / Path(member).name).write_bytes(archive.read(member))
    (root / "done").write_text("ok\n")
    return train, test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", choices=("paper", "stable"), default="stable")
    parser.add_argument("--warmup-epochs", type=float, default=1.0)
    parser.add_argument("--zero-init", choices=("on", "off"), default="off")
    parser.add_argument("--method", default="sb")
    parser.add_argument("--phase-epochs", default="4,3,3", help="sb: A,B,C (the same 10 epochs a step as std)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--memory", type=int, default=500)
    parser.add_argument("--arch", default="resnet32")
    parser.add_argument("--width", type=float, default=1.0)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--per-class", type=int, default=250)
    parser.add_argument("--steps", type=int, default=None, help="learn only the first N tasks (same step 1 as the full run)")
    parser.add_argument("--zip", type=Path, default=ZIP)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "sbcli-small-budget")
    args = parser.parse_args()

    import torch

    from sbcli import api
    from sbcli.engine.loop import TrainConfig

    torch.set_num_threads(1)
    train_dir, test_dir = build_folder(args.zip, args.work / f"c{args.classes}-n{args.per_class}", args.classes,
                                       args.per_class)
    stable = args.init == "stable"
    cfg = TrainConfig(epochs=args.epochs, batch_size=128, lr=args.lr,
                      warmup_epochs=args.warmup_epochs if stable else 0.0,
                      zero_init_residual=stable and args.zero_init == "on")
    phases = args.phase_epochs.split(",") if args.method == "sb" and args.phase_epochs else []
    method_options = dict(zip(("epochs_a", "epochs_b", "epochs_c"), map(int, phases), strict=True)) if phases else {}
    run = api.RunOptions(method=args.method, method_options=method_options, arch=args.arch, width=args.width,
                         train=cfg, memory=args.memory, seed=args.seed, device="cpu")
    steps = args.steps or args.tasks
    seq = api.SequenceOptions(source=str(train_dir), test=str(test_dir), tasks=steps, order_seed=0,
                              classes=args.classes // args.tasks * steps)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        learner = api.train(seq, run, Path(tmp) / "learner")
    history = learner.state.history
    overall = [h.metrics.overall for h in history]
    print(json.dumps({
        "seed": args.seed, "init": args.init, "warmup_epochs": cfg.warmup_epochs, "zero_init": cfg.zero_init_residual,
        "method": args.method, "steps": steps, "lr": args.lr, "memory": args.memory, "first": overall[0], "overall": overall,
        "old": [h.metrics.old for h in history], "new": [h.metrics.new for h in history],
        "avg_2_to_T": sum(overall[1:]) / max(1, len(overall) - 1), "avg_1_to_T": sum(overall) / len(overall),
        "first_losses": [p["final_loss"] for p in history[0].phases], "seconds": round(time.perf_counter() - start, 1),
    }), flush=True)


if __name__ == "__main__":
    main()
