"""Load test of `sb serve` on loopback against onnxruntime called in-process, plus a reload under load.

Usage::

    nice -n 10 python benchmarks/serve_load.py                       # random ResNet-18 x0.25, 100 classes, 32 px
    nice -n 10 python benchmarks/serve_load.py --model model.onnx --clients 16 --requests 2000 --workers 2

It starts ``python -m sbcli serve MODEL`` on 127.0.0.1 (a free port), then ``--clients`` threads,
each on its own keep-alive connection, send one PNG image per ``POST /predict`` until
``--requests`` are answered or ``--max-seconds`` pass (bounded in count and time). In the middle of
the run the served file is replaced by a copy whose class names differ (as ``sb export -o`` does),
so the server reloads under load; the run then counts the failed requests (any non-200) and
which model versions answered. The baselines run in this process on the same images, before and
after the HTTP run (a shared machine's load changes): onnxruntime one image per call (decode
included, as a server would), then in batches of ``--max-batch-size``.
Latencies are per request as the client sees them; p50/p99 are over all requests. Clients and the
server share this machine's CPUs, so with few cores the HTTP numbers include the clients' own cost.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

from sbcli.serve.classifier import open_onnx


def random_model(out: Path, width: float, classes: int, size: int) -> Path:
    """A random-weight learner exported to ``out`` (speed does not depend on the weights)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from onnx_speed import random_learner  # imports torch: only to build the model

    from sbcli.export.onnx import export_onnx

    return export_onnx(random_learner(width, classes, size), out).path


def renamed_copy(model: Path, out: Path) -> Path:
    import onnx

    proto = onnx.load(str(model))
    for prop in proto.metadata_props:
        if prop.key == "class_names":
            prop.value = json.dumps([f"reloaded_{i}" for i in range(len(json.loads(prop.value)))])
    onnx.save_model(proto, str(out))
    return out


def pngs(count: int, size: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentiles(seconds: list[float]) -> tuple[float, float]:
    ms = np.array(seconds) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def in_process(model: Path, images: list[bytes], batch: int, count: int) -> dict[str, tuple[float, float, float]]:
    """(images/s, p50 ms, p99 ms) of onnxruntime in this process: one image per call, and batched."""
    classifier = open_onnx(model, "cpu")
    spec = classifier.preprocess
    for data in images[:5]:
        classifier.scores(spec.to_input([spec.decode(data)]))
    single = []
    start = time.perf_counter()
    for i in range(count):
        t = time.perf_counter()
        classifier.scores(spec.to_input([spec.decode(images[i % len(images)])]))
        single.append(time.perf_counter() - t)
    single_rate = count / (time.perf_counter() - start)
    batched = []
    start = time.perf_counter()
    for i in range(0, count, batch):
        t = time.perf_counter()
        chunk = [images[(i + j) % len(images)] for j in range(min(batch, count - i))]
        classifier.scores(spec.to_input([spec.decode(d) for d in chunk]))
        batched.append(time.perf_counter() - t)
    batched_rate = count / (time.perf_counter() - start)
    return {"onnxruntime in-process, 1 image per call": (single_rate, *percentiles(single)),
            f"onnxruntime in-process, batches of {batch} (per batch)": (batched_rate, *percentiles(batched))}


def load(port: int, images: list[bytes], clients: int, requests: int, max_seconds: float,
         swap: tuple[Path, Path] | None) -> dict:
    """Send ``requests`` POSTs from ``clients`` threads; replace the model half-way when ``swap`` is given."""
    lock, counter = threading.Lock(), {"next": 0}
    latencies: list[float] = []
    failures: list[str] = []
    versions: dict[int, int] = {}
    deadline = time.monotonic() + max_seconds

    def take() -> int | None:
        with lock:
            if counter["next"] >= requests or time.monotonic() > deadline:
                return None
            counter["next"] += 1
            if swap is not None and counter["next"] == requests // 2:
                os.replace(swap[1], swap[0])
            return counter["next"]

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while (i := take()) is not None:
            t = time.perf_counter()
            try:
                conn.request("POST", "/predict?top_k=1", body=images[i % len(images)], headers={"Content-Type": "image/png"})
                res = conn.getresponse()
                body = res.read()
            except (OSError, http.client.HTTPException) as err:
                failures.append(f"{type(err).__name__}: {err}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                continue
            latencies.append(time.perf_counter() - t)
            if res.status != 200:
                failures.append(f"HTTP {res.status}: {body[:200]!r}")
                continue
            version = json.loads(body)["model_version"]
            with lock:
                versions[version] = versions.get(version, 0) + 1
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"answered": len(latencies), "wall": wall, "latencies": latencies, "failures": failures, "versions": versions}


def wait_ready(port: int, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"sb serve did not start: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="an .onnx file from sb export (default: a random ResNet-18)")
    parser.add_argument("--width", type=float, default=0.25)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--no-reload", action="store_true", help="do not replace the model during the run")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        served = Path(tmp) / "served.onnx"
        if args.model:
            served.write_bytes(args.model.read_bytes())
        else:
            random_model(served, args.width, args.classes, args.image_size)
        first = open_onnx(served, "cpu")
        size, arch, classes = first.image_size, first.meta.raw.get("arch", "?"), len(first.class_names)
        images = pngs(64, size)
        baseline = in_process(served, images, args.max_batch_size, min(args.requests, 400))
        staged = None if args.no_reload else renamed_copy(served, Path(tmp) / "next.onnx")
        port = free_port()
        cmd = [sys.executable, "-m", "sbcli", "serve", str(served), "--port", str(port), "--workers", str(args.workers),
               "--provider", "cpu", "--max-batch-size", str(args.max_batch_size), "--max-wait-ms", str(args.max_wait_ms),
               "--reload-interval", "0.5"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_ready(port, proc, 120)
            load(port, images, args.clients, min(args.clients * 4, args.requests), args.max_seconds, None)  # warm-up
            run = load(port, images, args.clients, args.requests, args.max_seconds, (served, staged) if staged else None)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/metadata")
            batching = json.loads(conn.getresponse().read())["batching"]  # one worker's counters
        finally:
            proc.terminate()
            proc.wait(30)
        after = in_process(served, images, args.max_batch_size, min(args.requests, 400))  # the machine may have changed
    p50, p99 = percentiles(run["latencies"]) if run["latencies"] else (float("nan"), float("nan"))
    print(f"model: {arch}, {classes} classes, {size}x{size} input; "
          f"{os.cpu_count()} CPUs; sb serve --workers {args.workers} --max-batch-size {args.max_batch_size} "
          f"--max-wait-ms {args.max_wait_ms:g}; {args.clients} clients, {args.requests} requests of 1 PNG")
    print()
    print("| path | images/s | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|")
    print(f"| sb serve over HTTP ({args.clients} clients, loopback) | {run['answered'] / run['wall']:.0f} | {p50:.1f} | {p99:.1f} |")
    for when, rows in (("before", baseline), ("after", after)):
        for name, (rate, b50, b99) in rows.items():
            print(f"| {name} ({when}) | {rate:.0f} | {b50:.1f} | {b99:.1f} |")
    print()
    print(f"answered {run['answered']} of {args.requests} requests in {run['wall']:.1f} s; failed: {len(run['failures'])}; "
          f"answers by model version: {dict(sorted(run['versions'].items()))}"
          + ("" if staged is None else " (the file was replaced half-way: version 2 is the reloaded model)"))
    print(f"batching (one worker's counters since it started, warm-up included): {batching['images']} images "
          f"in {batching['batches']} model calls, mean batch {batching['mean_batch']:.1f}, largest {batching['largest']}")
    for failure in run["failures"][:5]:
        print(f"  failure: {failure}")


if __name__ == "__main__":
    main()
