"""int8 (``sb export --int8``) against float32 ONNX on the CPU: file size and images/s at batch 1 and 64.

Usage::

    nice -n 10 python benchmarks/int8_speed.py --threads 1                  # ResNet-18 x1.0, 100 classes, 32 px
    nice -n 10 python benchmarks/int8_speed.py my-learner --threads 1

Without a learner directory it builds one with random weights (speed does not depend on them, but
the top-1 agreement printed then means little: give a trained learner for that). The float model
is ``sb export``'s, the int8 model is quantised from it exactly as ``sb export --int8`` does (QDQ,
per-channel int8 weights, calibrated on the exemplar memory), without the agreement threshold.
Both run in onnxruntime on the CPU with the same ``--threads``; the two are timed in turn, batch by
batch (so a busy machine slows both alike), and the ratios int8 / float32 are printed beside the
absolute numbers. Absolute numbers on a shared machine are noisy; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from onnx_speed import interleaved_ms, random_learner

from sbcli.export.onnx import INPUT_NAME, OUTPUT_NAME, export_onnx, ort_session
from sbcli.export.quantize import calibration_images, quantize
from sbcli.learner.state import Learner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("learner", nargs="?", type=Path, help="a learner directory (default: a random ResNet-18)")
    parser.add_argument("--width", type=float, default=1.0)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    learner = Learner.load(args.learner, "cpu") if args.learner else random_learner(args.width, args.classes, args.image_size)
    size = learner.state.image_size
    with tempfile.TemporaryDirectory() as work:
        fp32, int8 = Path(work) / "fp32.onnx", Path(work) / "int8.onnx"
        export_onnx(learner, fp32)
        calibration, source = calibration_images(learner, 512)
        quantize(fp32, int8, calibration)
        sessions = {"float32": ort_session(fp32, args.threads), "int8": ort_session(int8, args.threads)}
        ref, got = (s.run([OUTPUT_NAME], {INPUT_NAME: calibration})[0].argmax(1) for s in sessions.values())
        sizes = {"float32": fp32.stat().st_size, "int8": int8.stat().st_size}
        print(f"model: {args.learner or f'random ResNet-18 x{args.width}'}, {learner.state.num_classes} classes, {size} px; "
              f"onnxruntime CPU, {args.threads} thread(s)")
        print(f"size: float32 {sizes['float32'] / 1e6:.2f} MB, int8 {sizes['int8'] / 1e6:.2f} MB "
              f"(int8 / float32 = {sizes['int8'] / sizes['float32']:.2f})")
        print(f"top-1 agreement int8 vs float32 on {len(calibration)} images of {source}: {100 * np.mean(ref == got):.1f} %")
        print(f"{'batch':>5}  {'float32 img/s':>13}  {'int8 img/s':>10}  {'int8 / float32':>14}")
        for batch in args.batches:
            images = np.random.default_rng(0).random((batch, 3, size, size), dtype=np.float32)
            runs = {name: (lambda s=s, x=images: s.run([OUTPUT_NAME], {INPUT_NAME: x})) for name, s in sessions.items()}
            ms = interleaved_ms(runs, args.warmup, args.repeats)
            rate = {name: 1000 * batch / t for name, t in ms.items()}
            print(f"{batch:>5}  {rate['float32']:>13.1f}  {rate['int8']:>10.1f}  {rate['int8'] / rate['float32']:>14.2f}")


if __name__ == "__main__":
    main()
