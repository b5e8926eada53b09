"""Peak memory of `sb add-task` against the number of new images, for a frozen backbone (RanPAC or SimpleCIL).

Writes synthetic class-per-folder JPEG images at ``--image-size`` (a smooth colour field per image, a
hue per class), trains a small backbone learner (``--arch``, default the ImageNet-style ResNet-18, at
``--width``, one epoch on images of its own), starts a RanPAC learner on it (``--method simplecil``: a SimpleCIL
one) with a first task of 2 classes, then times one
``sb add-task COPY FOLDER`` per size in ``--images`` (10 new classes) on a fresh copy of that learner,
and prints one JSON line per size: the peak resident memory of the add-task process (``ru_maxrss`` of
a child waited for alone), its wall time and its images per second; then the ratio of the largest
peak to the smallest.

    python benchmarks/add_task_memory.py --out /tmp/mem --images 2000,8000,32000
    python benchmarks/add_task_memory.py --out /tmp/mem --images 2000,8000,32000 --method simplecil

Run it with the sbcli to measure on the import path (``PYTHONPATH=...``).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = 10


def write_images(root: Path, classes: int, per_class: int, size: int, seed: int, prefix: str = "c") -> None:
    """Smooth images (cheap to encode and decode, as photos are) with a little noise, a hue per class."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, size, dtype=np.float32)
    for c in range(classes):
        folder = root / f"{prefix}{c:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        colour = rng.uniform(40, 215, 3).astype(np.float32)
        for i in range(per_class):
            tilt = rng.uniform(-40, 40, 3).astype(np.float32)
            field = colour + tilt * ramp[:, None, None] + rng.normal(0, 8, (size, 1, 3)).astype(np.float32)
            pixels = np.clip(np.broadcast_to(field, (size, size, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:06d}.jpg", quality=85)


def sb(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "sbcli", *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"sb {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def measured(*args: str) -> tuple[float, float]:
    """(peak RSS in MiB, seconds) of ``sb ARGS``, run in a fresh process that waits for it alone."""
    probe = ("import resource, subprocess, sys, time\n"
             "t = time.perf_counter()\n"
             "done = subprocess.run([sys.executable, '-m', 'sbcli', *sys.argv[1:]], capture_output=True, text=True)\n"
             "if done.returncode: sys.exit(done.stderr[-3000:])\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.perf_counter() - t)\n")
    done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"sb {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    kib, seconds = done.stdout.split()
    return int(kib) / 1024, float(seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--images", default="2000,8000,32000", help="new images per add-task, comma-separated")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--arch", default="resnet18-in", help="the backbone's architecture (resnet18-in: ImageNet-style stem)")
    ap.add_argument("--width", type=float, default=0.25)
    ap.add_argument("--method", choices=("ranpac", "simplecil"), default="ranpac")
    ap.add_argument("--projection", type=int, default=2000, help="RanPAC's --projection")
    ap.add_argument("--threads", type=int, default=0, help="--threads of the learner (0: as sbcli chooses)")
    args = ap.parse_args()
    size, out = args.image_size, args.out
    common = ["--device", "cpu", "-q"]
    base = out / ("base" if args.method == "ranpac" else f"base-{args.method}")
    if not (out / "backbone").is_dir():
        write_images(out / "backbone-data", 4, 20, size, 1, prefix="b")
        write_images(out / "first" / "train", 2, 20, size, 2, prefix="f")
        write_images(out / "first" / "test", 2, 10, size, 3, prefix="f")
        sb("train", str(out / "backbone-data"), "--method", "std", "--arch", args.arch, "--width", str(args.width),
           "--epochs", "1", "--image-size", str(size), "--no-test-sample", "-o", str(out / "backbone"), *common)
    if not base.is_dir():
        extra = ["--threads", str(args.threads)] if args.threads else []
        if args.method == "ranpac":
            extra += ["--projection", str(args.projection)]
        sb("train", str(out / "first" / "train"), "--test", str(out / "first" / "test"), "--method", args.method,
           "--pretrained", str(out / "backbone"), "-o", str(base), *extra, *common)
    peaks = {}
    for n in [int(v) for v in args.images.split(",")]:
        folder = out / f"new-{n}"
        if not folder.is_dir():
            write_images(folder, CLASSES, n // CLASSES, size, 10 + n)
        learner = out / f"learner-{n}"
        shutil.rmtree(learner, ignore_errors=True)
        shutil.copytree(base, learner)
        peak, seconds = measured("add-task", str(learner), str(folder), *common)
        peaks[n] = peak
        print(json.dumps({"method": args.method, "images": n, "image_size": size, "arch": args.arch,
                          "width": args.width, **({"projection": args.projection} if args.method == "ranpac" else {}), "peak_rss_mib": round(peak, 1),
                          "seconds": round(seconds, 1), "images_per_s": round(n / seconds, 1)}), flush=True)
        shutil.rmtree(learner)
    print(json.dumps({"largest_over_smallest_peak": round(max(peaks.values()) / min(peaks.values()), 3),
                      "ru_maxrss_of": "the add-task process", "max_rss_of_this_script_mib":
                      round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}), flush=True)


if __name__ == "__main__":
    main()
