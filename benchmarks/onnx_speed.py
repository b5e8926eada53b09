"""ONNX (onnxruntime) against PyTorch (eager) on the CPU: time per batch of an exported learner.

Usage::

    nice -n 10 python benchmarks/onnx_speed.py                      # ResNet-18 x1.0, 100 classes, 32 px
    nice -n 10 python benchmarks/onnx_speed.py my-learner --batch 64

Without a learner directory it builds one with random weights (speed does not depend on them):
``--width`` and ``--classes`` size it. Both runtimes get the same thread count (``--threads``,
default: the CPUs this process may use), the same [0, 1] float32 images and the same graph
(normalisation + scoring module, :func:`sbcli.export.onnx.serving_model`). After a warm-up, the
median of ``--repeats`` timed batches (the two runtimes in turn) is reported, then the ratio PyTorch / ONNX (above 1: ONNX
is faster). The export's own parity check runs first and is printed too. ``--half`` also times the
fp16 export (``sb export --half``) in the same interleaved loop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from sbcli.engine.loop import TrainConfig
from sbcli.export.onnx import OnnxConfig, export_onnx, ort_session, serving_model
from sbcli.learner.records import MemorySettings, Provenance, StepRecord
from sbcli.learner.state import Learner, LearnerState
from sbcli.methods import build_config
from sbcli.methods.memory import ExemplarMemory
from sbcli.metrics import StepMetrics
from sbcli.nets import create_model


def random_learner(width: float, classes: int, size: int) -> Learner:
    """An STD+WA learner of ``classes`` classes in one step, random weights, 64 random exemplars."""
    nan = float("nan")  # never evaluated
    state = LearnerState(arch="resnet18", width=width, image_size=size,
                         normalization={"mean": [0.5071, 0.4867, 0.4408], "std": [0.2675, 0.2565, 0.2761]},
                         method="std", method_config=build_config("std", {}), train_config=TrainConfig(),
                         memory=MemorySettings(64), seed=0,
                         class_names=[f"c{i}" for i in range(classes)], class_task=[0] * classes,
                         history=[StepRecord(1, classes, StepMetrics(nan, [nan], nan, nan, nan, nan))],
                         provenance=Provenance(dataset="random (benchmark)"))
    memory = ExemplarMemory(64)
    memory.images = torch.randint(0, 256, (64, 3, size, size), dtype=torch.uint8)
    memory.labels = torch.arange(64) % classes
    return Learner(state, create_model("resnet18", classes, width).eval(), memory)


def interleaved_ms(runs: dict[str, Callable[[], object]], warmup: int, repeats: int) -> dict[str, float]:
    """Median milliseconds per call of each runner, timed in turn (so a busy machine slows both alike)."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("learner", nargs="?", type=Path, help="a learner directory (default: a random ResNet-18)")
    parser.add_argument("--width", type=float, default=1.0)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--half", action="store_true", help="also time the fp16 export (sb export --half)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    learner = Learner.load(args.learner) if args.learner else random_learner(args.width, args.classes, args.image_size)
    size = learner.state.image_size
    with tempfile.TemporaryDirectory() as tmp:
        report = export_onnx(learner, Path(tmp) / "model.onnx", OnnxConfig())
        session = ort_session(report.path, threads=args.threads)
        model = serving_model(learner)
        x = np.random.default_rng(0).random((args.batch, 3, size, size), dtype=np.float32)
        xt = torch.from_numpy(x)

        def run_torch() -> object:
            with torch.inference_mode():
                return model(xt)

        def run_onnx() -> object:
            return session.run(["logits"], {"images": x})

        runs = {"torch": run_torch, "onnx": run_onnx}
        if args.half:
            half = export_onnx(learner, Path(tmp) / "half.onnx", OnnxConfig(half=True))
            half_session = ort_session(half.path, threads=args.threads)
            runs["onnx fp16"] = lambda: half_session.run(["logits"], {"images": x})
        ms = interleaved_ms(runs, args.warmup, args.repeats)
        torch_ms, onnx_ms = ms["torch"], ms["onnx"]
    s = learner.state
    print(f"model: {s.arch} x{s.width}, {s.num_classes} classes, {size}x{size}; batch {args.batch}; "
          f"{args.threads} threads; torch {torch.__version__}; median of {args.repeats}")
    print(f"parity: max |ONNX - PyTorch| = {report.parity.max_abs_diff:.2e}, argmax agreement "
          f"{100 * report.parity.argmax_agreement:.1f} % on {report.parity.images} images")
    print(f"PyTorch eager: {torch_ms:.1f} ms/batch ({1000 * args.batch / torch_ms:.0f} img/s)")
    print(f"onnxruntime:   {onnx_ms:.1f} ms/batch ({1000 * args.batch / onnx_ms:.0f} img/s)")
    print(f"ratio PyTorch / ONNX = {torch_ms / onnx_ms:.2f} (above 1: ONNX is faster)")
    if args.half:
        print(f"onnxruntime fp16 (--half): {ms['onnx fp16']:.1f} ms/batch; ratio fp32 / fp16 = "
              f"{onnx_ms / ms['onnx fp16']:.2f} (above 1: fp16 is faster); parity max diff {half.parity.max_abs_diff:.2e}, "
              f"argmax agreement {100 * half.parity.argmax_agreement:.1f} %, {half.bytes / 1e6:.1f} MB vs {report.bytes / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
