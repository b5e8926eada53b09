"""`sb serve` over HTTP against gRPC, side by side in one run on one model, and its memory serving a
learner directory against serving the learner's exported .onnx file.

Usage::

    nice -n 10 python benchmarks/serve_protocols.py --learner my-learner              # exports my-learner.onnx first
    nice -n 10 python benchmarks/serve_protocols.py --learner my-learner --onnx my-learner.onnx --requests 400

It starts ``python -m sbcli serve ONNX --grpc-port G`` on 127.0.0.1 (free ports), warms it up, then
for each protocol (Triton's own clients: ``tritonclient.http`` with binary tensors, and
``tritonclient.grpc``) and each number of clients (1 and 8 threads, each with its own client and
connection) sends ``--requests`` requests of one preprocessed FP32 image [1, 3, S, S] and measures
images/s (requests answered over the wall time) and each request's latency as the client sees it
(p50, p99). The cells run interleaved in rounds (HTTP 1, gRPC 1, HTTP 8, gRPC 8, then again), so a
shared machine's load changes touch every cell alike; a cell's figure pools its rounds.

Memory: the server's resident set (``VmRSS``) and its peak (``VmHWM``) from ``/proc/PID/status``,
once ready and after 50 requests, for ``sb serve ONNX`` and for ``sb serve LEARNER`` (which
exports the learner's kept steps to the serve cache, in a fresh cache so it really exports:
that process imports torch). Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of ``pid`` in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def start(source: Path, port: int, grpc_port: int | None, env: dict[str, str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sbcli", "serve", str(source), "--port", str(port), "--reload-interval", "0",
           "--provider", "cpu"] + (["--grpc-port", str(grpc_port)] if grpc_port else [])
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def wait_ready(client, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if client.is_server_ready():
                return
        except Exception:  # not listening yet  # noqa: BLE001
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"sb serve did not become ready:\n{proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.2)


def module(protocol: str):
    """Triton's client module for ``protocol``."""
    import importlib

    return importlib.import_module(f"tritonclient.{protocol}")


def make_client(protocol: str, address: str):
    if protocol == "http":
        return module("http").InferenceServerClient(address, network_timeout=60)
    return module("grpc").InferenceServerClient(address)


def one_request(protocol: str, client, name: str, image: np.ndarray) -> None:
    """One FP32 image, binary on the wire either way (HTTP's binary extension, gRPC's raw contents)."""
    triton = module(protocol)
    tensor = triton.InferInput("images", list(image.shape), "FP32")
    if protocol == "http":
        tensor.set_data_from_numpy(image, binary_data=True)
        outputs = [triton.InferRequestedOutput("logits", binary_data=True)]
    else:
        tensor.set_data_from_numpy(image)
        outputs = [triton.InferRequestedOutput("logits")]
    client.infer(name, [tensor], outputs=outputs)


def cell(protocol: str, address: str, name: str, images: np.ndarray, clients: int, requests: int) -> tuple[float, list[float]]:
    """Wall seconds and every request's latency for ``requests`` requests over ``clients`` threads."""
    latencies: list[float] = []
    left = [requests]
    lock = threading.Lock()
    pool = [make_client(protocol, address) for _ in range(clients)]

    def run(client) -> None:
        rng = np.random.default_rng(len(latencies))
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            image = images[rng.integers(len(images))][None]
            start = time.perf_counter()
            one_request(protocol, client, name, image)
            seconds = time.perf_counter() - start
            with lock:
                latencies.append(seconds)

    threads = [threading.Thread(target=run, args=(c,)) for c in pool]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    for c in pool:
        c.close()
    return wall, latencies


def protocols(onnx: Path, requests: int, rounds: int, env: dict[str, str]) -> list[tuple[str, int, float, float, float]]:
    """(protocol, clients, images/s, p50 ms, p99 ms) of every cell, and the server's memory."""
    from sbcli.serve.classifier import open_onnx
    from sbcli.serve.source import model_name

    port, grpc_port = free_port(), free_port()
    proc = start(onnx, port, grpc_port, env)
    try:
        address = {"http": f"127.0.0.1:{port}", "grpc": f"127.0.0.1:{grpc_port}"}
        wait_ready(make_client("http", address["http"]), proc, 300)
        size = open_onnx(onnx, "cpu").image_size
        images = np.random.default_rng(0).random((64, 3, size, size), dtype=np.float32)
        name = model_name(onnx)
        for protocol in ("http", "grpc"):
            cell(protocol, address[protocol], name, images, 1, 20)  # warm-up
        cells = [(p, c) for c in (1, 8) for p in ("http", "grpc")]
        walls = {key: 0.0 for key in cells}
        lats: dict[tuple[str, int], list[float]] = {key: [] for key in cells}
        for _ in range(rounds):
            for protocol, clients in cells:
                wall, got = cell(protocol, address[protocol], name, images, clients, requests // rounds)
                walls[(protocol, clients)] += wall
                lats[(protocol, clients)] += got
        rows = []
        for key in cells:
            ms = np.array(lats[key]) * 1000
            rows.append((*key, len(ms) / walls[key], float(np.percentile(ms, 50)), float(np.percentile(ms, 99))))
        return rows
    finally:
        proc.terminate()
        proc.wait(30)


def memory(source: Path, env: dict[str, str]) -> dict[str, float]:
    """The server's memory serving ``source``: when ready, then after 50 requests of one image."""
    port = free_port()
    proc = start(source, port, None, env)
    try:
        client = make_client("http", f"127.0.0.1:{port}")
        wait_ready(client, proc, 600)
        ready = memory_mib(proc.pid)
        from sbcli.serve.source import model_name

        meta = client.get_model_metadata(model_name(source))
        size = meta["inputs"][0]["shape"][-1]
        image = np.random.default_rng(1).random((1, 3, size, size), dtype=np.float32)
        for _ in range(50):
            one_request("http", client, model_name(source), image)
        after = memory_mib(proc.pid)
        return {"ready": ready["VmRSS"], "after": after["VmRSS"], "peak": after["VmHWM"]}
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learner", type=Path, required=True, help="a learner directory")
    parser.add_argument("--onnx", type=Path, help="its export (default: exported here with sb export)")
    parser.add_argument("--requests", type=int, default=400, help="requests per cell, over all rounds")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    env = {**os.environ}
    with tempfile.TemporaryDirectory() as tmp:
        onnx = args.onnx
        if onnx is None:
            onnx = Path(tmp) / f"{args.learner.resolve().name}.onnx"
            subprocess.run([sys.executable, "-m", "sbcli", "export", str(args.learner), "-o", str(onnx)], check=True,
                           stdout=subprocess.DEVNULL, env=env)
        rows = protocols(onnx, args.requests, args.rounds, env)
        env["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # a fresh serve cache: the learner is really exported
        on_learner, on_onnx = memory(args.learner, env), memory(onnx, env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"`sb serve {onnx.name}` on a {cores}-core CPU, one FP32 image [1, 3, S, S] per request, "
          f"{args.requests} requests per cell in {args.rounds} interleaved rounds")
    print("\n| protocol | clients | images/s | p50 ms | p99 ms |\n|---|---:|---:|---:|---:|")
    for protocol, clients, rate, p50, p99 in rows:
        print(f"| {protocol} | {clients} | {rate:.0f} | {p50:.1f} | {p99:.1f} |")
    print("\n| served | RSS when ready MiB | RSS after 50 requests MiB | peak MiB |\n|---|---:|---:|---:|")
    for label, mem in ((f"learner directory {args.learner.name}", on_learner), (f"its export {onnx.name}", on_onnx)):
        print(f"| {label} | {mem['ready']:.0f} | {mem['after']:.0f} | {mem['peak']:.0f} |")


if __name__ == "__main__":
    main()
