"""Whole `sb add-task` commands side by side at the resolution a pretrained backbone runs at: ridge head against S&B + WA.

Timing only. One backbone for both learners: a full-width ImageNet-style ResNet-18 (``resnet18-in``, the
architecture of timm's and torchvision's ResNet-18 weights) with random weights, saved once as safetensors and
given to both as ``--pretrained``; random weights make the accuracies meaningless, so none is reported.
CIFAR-10's JPEGs are resized by sbcli to ``--image-size`` (224, what ImageNet backbones are trained at). Task 1
(2 classes) is learned by ``sb train`` into each learner, at the defaults `sb train FOLDER` gives a folder
(ranpac: nothing trains; S&B + WA: 30 epochs a phase); task 2 (2 other classes) is the timed ``sb add-task``,
taken in turn, A B A B, each run on a fresh copy of its learner with an empty ``SBCLI_CACHE`` (a user's first
add-task decodes its images and computes its test features once). ``--per-class`` training and
``--test-per-class`` test images a class. One JSON line per run on stdout, then a markdown table on stderr:

    PYTHONPATH=. python benchmarks/add_task_speed.py --data DIR/cifar10-jpeg.zip --per-class 50 --test-per-class 20 --runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from pretrained_path import members, write_classes

LEARNERS = {"ridge": ["--method", "ranpac"], "sb": ["--method", "sb"]}
ARCH = ["--arch", "resnet18-in", "--width", "1"]


def sb(*args: str, env: dict[str, str]) -> float:
    """Run ``sb ARGS`` (quiet), fail loudly, return its wall seconds."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sbcli", *args, "--quiet"], env=env, capture_output=True, text=True,
                          check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"sb {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return seconds


def backbone(path: Path) -> Path:
    """Random ``resnet18-in`` weights at width 1 (seed 0), as a safetensors file both learners start from."""
    import torch
    from safetensors.torch import save_file

    from sbcli.nets import create_model

    torch.manual_seed(0)
    tensors = {k: v.contiguous() for k, v in create_model("resnet18-in", 1, 1.0).state_dict().items()
               if not k.startswith("head.")}
    save_file(tensors, str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="cifar10-jpeg.zip: <top>/{train,test}/<class>/*.jpg")
    parser.add_argument("--per-class", type=int, default=50)
    parser.add_argument("--test-per-class", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--runs", type=int, default=2, help="timed add-tasks of each learner, in turn")
    parser.add_argument("--work", type=Path, default=None, help="where the folders and learners go (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="add-task-speed-"))
    with zipfile.ZipFile(args.data) as archive:
        names = members(archive)
        classes = sorted({n.split("/")[2] for n in names})[:4]
        for task, chosen in (("task1", classes[:2]), ("task2", classes[2:])):
            write_classes(archive, names, chosen, work / task, args.per_class, args.test_per_class)
    weights = backbone(work / "backbone.safetensors")
    env = {**os.environ, "SBCLI_CACHE": str(work / "cache-start")}
    for name, method in LEARNERS.items():
        if not (work / name / "learner.json").is_file():
            sb("train", str(work / "task1" / "train"), "--test", str(work / "task1" / "test"), "--tasks", "1",
               *method, *ARCH, "--pretrained", str(weights), "--image-size", str(args.image_size),
               "--out", str(work / name), env=env)
    seconds: dict[str, list[float]] = {name: [] for name in LEARNERS}
    for run in range(args.runs):
        for name in LEARNERS:
            copy, cache = work / f"{name}-run", work / f"cache-{name}-run"
            for path in (copy, cache):
                shutil.rmtree(path, ignore_errors=True)
            shutil.copytree(work / name, copy)
            env = {**os.environ, "SBCLI_CACHE": str(cache)}
            took = sb("add-task", str(copy), str(work / "task2" / "train"), "--test", str(work / "task2" / "test"), env=env)
            step = json.loads((copy / "learner.json").read_text())["history"][-1]["seconds"]
            seconds[name].append(took)
            print(json.dumps({"learner": name, "run": run, "add_task_s": round(took, 2), "step_s": step,
                              "image_size": args.image_size, "new_train_images": 2 * args.per_class,
                              "new_test_images": 2 * args.test_per_class}), flush=True)
    ridge, slow = statistics.median(seconds["ridge"]), statistics.median(seconds["sb"])
    print(f"\n| `sb add-task` at {args.image_size} px, {2 * args.per_class} new images | median s | runs |\n|---|---:|---|",
          file=sys.stderr)
    for name, label in (("ridge", "ridge head (ranpac)"), ("sb", "S&B + WA, 30 epochs a phase")):
        print(f"| {label} | {statistics.median(seconds[name]):.1f} | {', '.join(f'{s:.1f}' for s in seconds[name])} |",
              file=sys.stderr)
    print(f"\nS&B / ridge: {slow / ridge:.0f}x", file=sys.stderr)


if __name__ == "__main__":
    main()
