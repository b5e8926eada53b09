"""What the live progress bars cost the training loop: the same phase with and without them.

Trains one phase of a small network (cross-entropy, no teacher) with :class:`sbcli.engine.loop.Engine`
in alternating rounds: ``none`` (no progress callback), ``lines`` (one line per epoch) and
``live`` (rich bars on a terminal, the engine calling ``on_batch`` after every batch, rendered to
a string buffer forced to be a terminal). Small batches make the per-batch callback as frequent as
it gets. Prints the median seconds per epoch of each and the ratio to ``none``.

Example::

    OMP_NUM_THREADS=1 python benchmarks/progress_overhead.py --device cpu --rounds 5
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import torch
from rich.console import Console

from sbcli.cli import progress
from sbcli.data.device import DeviceData, Normalization
from sbcli.engine.loop import Engine, Phase, TrainConfig
from sbcli.nets import create_model


def one_round(kind: str, device: torch.device, args: argparse.Namespace) -> float:
    torch.manual_seed(0)
    images = torch.randint(0, 256, (args.images, 3, 32, 32), dtype=torch.uint8)
    labels = torch.randint(0, 10, (args.images,))
    data = DeviceData.join([(images, labels)], device)
    model = create_model("resnet18", 10, args.width).to(device)
    console = Console(file=io.StringIO(), force_terminal=kind == "live", width=120)
    reporter = None if kind == "none" else progress.reporter(False, console=console)
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, precision="fp32")
    engine = Engine(cfg, device, Normalization((0.5,) * 3, (0.25,) * 3), 0, reporter).for_step(1)
    phase = Phase("base", lambda out: torch.nn.functional.cross_entropy(out.logits, out.targets), args.epochs)
    start = time.perf_counter()
    if reporter is None:
        engine.run(model, data, phase)
    else:
        with reporter:
            reporter.on_plan({1: args.epochs})
            engine.run(model, data, phase)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / args.epochs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--width", type=float, default=0.125)
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    kinds = ("none", "lines", "live")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    one_round("none", device, args)  # warm-up (allocator, oneDNN/cuDNN kernels)
    for _ in range(args.rounds):
        for kind in kinds:
            times[kind].append(one_round(kind, device, args))
    base = statistics.median(times["none"])
    print(f"device {device}, width {args.width}, {args.images} images, batch {args.batch_size}, "
          f"{args.epochs} epochs x {args.rounds} rounds, torch threads {torch.get_num_threads()}")
    print("progress | median s/epoch | vs none")
    for kind in kinds:
        median = statistics.median(times[kind])
        print(f"{kind:8s} | {median:14.3f} | {median / base:.3f}")


if __name__ == "__main__":
    main()
