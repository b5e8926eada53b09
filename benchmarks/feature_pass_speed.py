"""The feature pass of `sb add-task` against a bare PyTorch loop and onnxruntime, side by side.

On one learner's backbone, one batch size and one thread count, each stage's images per second:

- ``decode``: decoding the folder's images in batches (:class:`sbcli.data.stream.FolderStream`, its
  thread pool), nothing else;
- ``add_task_pass``: what `sb add-task` of a frozen backbone runs (``stream_features``: decode ahead,
  the engine's frozen pass, on onnxruntime where it agrees with float32; the fingerprint);
- ``add_task_pass_torch``: the same with ``SBCLI_FEATURE_ENGINE=torch`` (the engine's PyTorch float32 forward);
- ``engine_forward``: the engine's feature pass on images already decoded;
- ``torch_loop``: a bare ``torch.inference_mode`` loop of ``forward_features`` on normalised batches
  (channels-last, as the engine feeds it), in float32, and in bfloat16 autocast with the largest
  difference of its features from float32's;
- ``onnxruntime``: the backbone exported to ONNX (``forward_features``) on onnxruntime's CPU provider;
- ``decode_then_onnxruntime``: the least an add-task pass can do: each batch decoded (the next one meanwhile),
  then through the feature pass's own onnxruntime session; no fingerprint, no progress;
- ``feature_session_decoded``: that session alone on images already decoded (uint8 in, the normalisation
  inside its graph): what the pass costs without decoding.

Then each pass's ratio to the fastest float32 one, and what the onnxruntime pass costs before its first
batch (``prepare_s``): the export and its check with an empty cache, then the check alone on a cache hit. Rounds alternate the passes, so that a loaded
machine slows them alike; the median of ``--rounds`` is printed.

    python benchmarks/feature_pass_speed.py LEARNER FOLDER --threads 2 --batch 64
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from sbcli.data.device import normalize
from sbcli.data.stream import FolderStream, decode_threads
from sbcli.engine import onnx_features
from sbcli.engine.loop import Engine
from sbcli.learner.state import Learner
from sbcli.run.add_task import stream_features


class Features(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.forward_features(x)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("learner", type=Path)
    ap.add_argument("folder", type=Path, help="class-per-folder images")
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    learner = Learner.load(args.learner, "cpu")
    model, size = learner.model.eval(), learner.state.image_size
    cfg = dataclasses.replace(learner.state.train_config, threads=args.threads, eval_batch_size=args.batch)
    engine = Engine(cfg, torch.device("cpu"), learner.norm, 0)
    torch_engine = Engine(cfg, torch.device("cpu"), learner.norm, 0)
    stream = FolderStream.scan(args.folder, size)
    stream.files, stream.labels = stream.files[: args.images], stream.labels[: args.images]
    n = len(stream)
    decoded = torch.cat([images for _, images in stream.batches(args.batch)])
    batches = [normalize(decoded[i:i + args.batch], learner.norm, True) for i in range(0, n, args.batch)]
    with tempfile.TemporaryDirectory() as tmp:
        prepare_s = {}
        for case in ("export_and_check", "cached_check"):
            start = time.perf_counter()
            feature_pass = onnx_features.prepare(model, decoded[: args.batch], lambda x: engine.features(model, x),
                                  device=torch.device("cpu"), sharded=False, norm=learner.norm,
                                  threads=args.threads, batch=args.batch, cache=Path(tmp) / "cache")
            prepare_s[case] = round(time.perf_counter() - start, 3)
        os.environ[onnx_features.ENV] = "torch"
        torch_engine.frozen_features(model, decoded[:1])  # this engine's pass is PyTorch's from here on
        os.environ.pop(onnx_features.ENV)
        onnx_path = Path(tmp) / "backbone.onnx"
        torch.onnx.export(Features(model), (batches[0],), str(onnx_path), input_names=["x"], output_names=["f"],
                          dynamic_axes={"x": {0: "n"}, "f": {0: "n"}}, dynamo=False)
        model.eval()  # the exporter leaves the module in training mode (BatchNorm on batch statistics)
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        plain = [b.contiguous().numpy() for b in batches]

        def torch_loop(bf16: bool = False) -> torch.Tensor:
            out = []
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                for b in batches:
                    out.append(model.forward_features(b).float())
            return torch.cat(out)

        reference = torch_loop()
        bf16_diff = float((torch_loop(True) - reference).abs().max() / reference.abs().max())
        ort_out = np.concatenate([session.run(None, {"x": b})[0] for b in plain])
        ort_diff = float(np.abs(ort_out - reference.numpy()).max() / reference.abs().max())
        engine_diff = float((engine.features(model, decoded) - reference).abs().max() / reference.abs().max())
        pass_diff = float((stream_features(stream, engine, model)[0] - reference).abs().max() / reference.abs().max())
        passes = {
            "decode": lambda: [None for _ in stream.batches(args.batch)],
            "add_task_pass": lambda: stream_features(stream, engine, model),
            "add_task_pass_torch": lambda: stream_features(stream, torch_engine, model),
            "decode_then_onnxruntime": lambda: [feature_pass(images) for _, images in stream.batches()],
            "feature_session_decoded": lambda: [feature_pass(decoded[i:i + args.batch]) for i in range(0, n, args.batch)],
            "engine_forward": lambda: engine.features(model, decoded),
            "torch_loop": lambda: torch_loop(),
            "torch_loop_bf16": lambda: torch_loop(True),
            "onnxruntime": lambda: [session.run(None, {"x": b}) for b in plain],
        }
        seconds: dict[str, list[float]] = {k: [] for k in passes}
        for _ in range(args.rounds):
            for name, fn in passes.items():
                seconds[name].append(timed(fn))
    rate = {k: n / statistics.median(v) for k, v in seconds.items()}
    fastest = max(rate[k] for k in ("engine_forward", "torch_loop", "onnxruntime", "add_task_pass"))
    # decoding and the forward share the CPU's cores: the most a pass doing both could run at
    bound = 1 / (1 / rate["decode"] + 1 / rate["onnxruntime"])
    print(json.dumps({
        "images": n, "image_size": size, "arch": learner.state.arch, "width": learner.state.width,
        "batch": args.batch, "threads": args.threads, "decode_threads": decode_threads(),
        "images_per_s": {k: round(v, 1) for k, v in rate.items()},
        "ratio_to_fastest_fp32_forward": {k: round(rate[k] / fastest, 3) for k in rate},
        "decode_plus_onnxruntime_bound": round(bound, 1),
        "add_task_pass_of_bound": round(rate["add_task_pass"] / bound, 3),
        "add_task_pass_of_decode_then_onnxruntime": round(rate["add_task_pass"] / rate["decode_then_onnxruntime"], 3),
        "max_relative_difference_from_fp32": {"bf16": round(bf16_diff, 5), "onnxruntime": round(ort_diff, 7),
                                              "engine": round(engine_diff, 7),
                                              "add_task_pass": round(pass_diff, 7)},
        "prepare_s": prepare_s,
    }), flush=True)


if __name__ == "__main__":
    main()
