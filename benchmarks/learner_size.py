"""How large a learner grows over a task sequence: bytes on disk after every kept step.

Writes a synthetic class-per-folder data set (noise around a colour per class, PNG), trains a small
backbone learner on classes of its own, then learns the data in ``--tasks`` tasks with each method
(``sb train DATA --tasks T``), keeping every step, and prints one JSON line per method: the learner's
total bytes, what lies under ``steps/`` and ``objects/``, and the target for a frozen backbone
(backbone + T x the head's per-step tensors + the carried test sample once).

    python benchmarks/learner_size.py --out /tmp/size --methods ranpac,sb

Run it with the sbcli to measure on the import path (``PYTHONPATH=...``): the same command before
and after a change of the learner format gives the two sizes side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image


def write_images(root: Path, classes: int, per_class: int, size: int, seed: int, prefix: str = "c") -> None:
    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = root / f"{prefix}{c:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        colour = rng.integers(0, 256, 3)
        for i in range(per_class):
            noise = rng.normal(0, 40, (size, size, 3))
            pixels = np.clip(colour + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:05d}.png")


def sb(*args: str) -> None:
    cmd = [sys.executable, "-m", "sbcli", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")


def sizes(learner: Path) -> dict[str, int]:
    out = {"total": 0, "steps": 0, "objects": 0, "files": 0}
    for p in learner.rglob("*"):
        if p.is_file() and not p.name.startswith(".sbcli.lock"):
            n = p.stat().st_size
            out["total"] += n
            out["files"] += 1
            top = p.relative_to(learner).parts[0]
            if top in ("steps", "objects"):
                out[top] += n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--methods", default="ranpac,sb")
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--classes", type=int, default=20)
    ap.add_argument("--train-per-class", type=int, default=30)
    ap.add_argument("--test-per-class", type=int, default=50)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--width", type=float, default=0.25)
    ap.add_argument("--projection", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=1)
    args = ap.parse_args()
    data = args.out / "data"
    if not data.is_dir():
        write_images(data / "train", args.classes, args.train_per_class, args.image_size, 0)
        write_images(data / "test", args.classes, args.test_per_class, args.image_size, 1)
        write_images(data / "backbone" / "train", 4, 20, args.image_size, 2, prefix="b")
    common = ["--device", "cpu", "--image-size", str(args.image_size), "-q"]
    backbone = args.out / "backbone"
    if not backbone.is_dir():
        sb("train", str(data / "backbone" / "train"), "--method", "std", "--width", str(args.width), "--arch",
           "resnet18", "--epochs", "1", "--no-test-sample", "-o", str(backbone), *common)
    for method in args.methods.split(","):
        learner = args.out / method
        extra = (["--pretrained", str(backbone), "--projection", str(args.projection)] if method == "ranpac"
                 else ["--width", str(args.width), "--arch", "resnet18", "--epochs", str(args.epochs)])
        start = time.perf_counter()
        sb("train", str(data / "train"), "--test", str(data / "test"), "--tasks", str(args.tasks), "--method", method,
           "-o", str(learner), *extra, *common)
        state = json.loads((learner / "learner.json").read_text())
        print(json.dumps({"method": method, "tasks": args.tasks, "classes": args.classes,
                          "image_size": args.image_size, "format_version": state["format_version"],
                          "kept_steps": len(state["kept_steps"]), "bytes": sizes(learner),
                          "seconds": round(time.perf_counter() - start, 1)}), flush=True)


if __name__ == "__main__":
    main()
