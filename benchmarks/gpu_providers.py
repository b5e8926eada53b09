"""onnxruntime providers side by side: CPU, CUDA, CUDA with CUDA graphs, TensorRT (fp32 and fp16, with
an engine cache), images/s at batch 1 and 64, each row naming the provider that actually ran.

Usage (on a machine with an NVIDIA GPU and ``sbcli[onnx-gpu]``)::

    python benchmarks/gpu_providers.py                        # ResNet-18 x1.0, 100 classes, 32 px, random weights
    python benchmarks/gpu_providers.py model.onnx --batches 1 64 256

A provider this onnxruntime lacks, or that does not load, is reported as such and skipped: on a
CPU-only machine only the CPU row runs. The models are the ones ``sb serve`` runs
(:func:`sbcli.serve.classifier.open_onnx` with :class:`sbcli.serve.gpu.GpuOptions`), timed in turn
batch by batch after a warm-up (TensorRT builds its engines during the warm-up, then caches them).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from onnx_speed import interleaved_ms, random_learner

from sbcli.errors import SbcliError
from sbcli.serve.gpu import GpuOptions
from sbcli.serve.classifier import OnnxClassifier, open_onnx

SETUPS = {
    "cpu": ("cpu", None),
    "cuda": ("cuda", None),
    "cuda + CUDA graphs": ("cuda", GpuOptions(cuda_graph=True)),
    "tensorrt fp32": ("tensorrt", GpuOptions()),
    "tensorrt fp16": ("tensorrt", GpuOptions(trt_fp16=True)),
}


def open_all(path: Path, cache: Path, threads: int | None) -> dict[str, OnnxClassifier]:
    models = {}
    for label, (provider, asked) in SETUPS.items():
        gpu = GpuOptions(trt_fp16=asked.trt_fp16, trt_cache=str(cache)) if provider == "tensorrt" and asked else asked
        try:
            models[label] = open_onnx(path, provider, threads, gpu)
        except SbcliError as err:
            print(f"{label}: skipped ({err})")
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", type=Path, help="an .onnx file from sb export (default: a random ResNet-18)")
    parser.add_argument("--width", type=float, default=1.0)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="CPU provider threads (default: onnxruntime's choice)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as work:
        path = args.model
        if path is None:
            from sbcli.export.onnx import export_onnx

            path = Path(work) / "model.onnx"
            export_onnx(random_learner(args.width, args.classes, args.image_size), path)
        models = open_all(path, Path(work) / "trt-cache", args.threads)
        size = next(iter(models.values())).image_size
        for label, model in models.items():
            print(f"{label}: ran on {model.provider}")
        print(f"{'batch':>5}  " + "  ".join(f"{label:>20}" for label in models) + "   (images/s)")
        for batch in args.batches:
            images = np.random.default_rng(0).random((batch, 3, size, size), dtype=np.float32)
            runs = {label: (lambda m=m, x=images: m.scores(x)) for label, m in models.items()}
            ms = interleaved_ms(runs, args.warmup, args.repeats)
            print(f"{batch:>5}  " + "  ".join(f"{1000 * batch / ms[label]:>20.1f}" for label in models))
        if "cpu" in models and len(models) > 1:
            print("ratios against the CPU provider: " + ", ".join(
                f"{label} x{ms['cpu'] / ms[label]:.2f}" for label in models if label != "cpu") + f" (batch {args.batches[-1]})")


if __name__ == "__main__":
    main()
