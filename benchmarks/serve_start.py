"""How soon `sb serve LEARNER` is ready, cold and warm, and the memory it peaks at with its export processes.

Usage::

    nice -n 10 python benchmarks/serve_start.py                         # this checkout, a 4-step learner
    nice -n 10 python benchmarks/serve_start.py --code before=/path/to/an/older/checkout --code after=.

It saves a learner of ``--steps`` kept steps (random ResNet-18 x``--width`` weights, ``--classes``
new classes a step, 32 px: the time is the exports', not the weights'), then, for each ``--code``
(a name and the folder whose ``sbcli`` runs, as PYTHONPATH), starts ``python -m sbcli serve
LEARNER`` on 127.0.0.1 twice with one fresh serve cache (``$XDG_CACHE_HOME``):

- ``cold``: the cache empty; seconds from the start until ``GET /v2/health/ready`` answers 200;
- ``warm``: the same cache, started again;

and after the cold start, the seconds one ``POST /v2/models/NAME/versions/1/infer`` takes (the
first request for the oldest step: exported on demand where the code does that). The peak memory
is the largest sum of the resident memory of the server and every process below it (the export
interpreters), sampled every 50 ms. Requests are few and bounded, on loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

TIMEOUT_S = 1800.0  # the longest a start may take before the run gives up on it (a loaded machine is slow)


def learner_with_steps(out: Path, steps: int, width: float, classes: int) -> Path:
    """A learner of ``steps`` kept steps, ``classes`` more classes each, random weights (imports torch)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from onnx_speed import random_learner

    from sbcli.learner.records import StepRecord, TaskRecord
    from sbcli.metrics import StepMetrics

    nan = float("nan")
    for step in range(1, steps + 1):
        torch.manual_seed(step)
        learner = random_learner(width, classes * step, 32)
        learner.state.class_task = [i // classes for i in range(classes * step)]
        learner.state.tasks = [TaskRecord(learner.state.class_names[t * classes:(t + 1) * classes], {"kind": "demo"})
                               for t in range(step)]
        learner.state.history = [StepRecord(s, classes * s, StepMetrics(nan, [nan] * s, nan, nan, nan, nan))
                                 for s in range(1, step + 1)]
        learner.save(out)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and every process below it, in MiB (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo += children.get(current, [])
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=60) as res:
            return res.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def infer_version(url: str, name: str, version: int) -> float:
    body = json.dumps({"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 3, 32, 32],
                                   "data": [0.5] * 3072}]}).encode()
    request = urllib.request.Request(f"{url}/v2/models/{name}/versions/{version}/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    deadline = time.monotonic() + TIMEOUT_S
    while True:  # code that answers 503 while it exports is asked again
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as res:
                assert res.status == 200
                return time.perf_counter() - start
        except urllib.error.HTTPError as err:
            if err.code != 503 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def start(code: Path, learner: Path, cache: Path, extra: list[str]) -> tuple[float, float, subprocess.Popen, str]:
    """A server started; (seconds until ready, peak MiB of its process tree until then, the process, its URL)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(code.resolve()), "XDG_CACHE_HOME": str(cache)}
    env.pop("SBCLI_SERVE_CACHE", None)
    began = time.perf_counter()
    log = (cache / "serve.log").open("w")  # a pipe nobody reads could fill and block the server
    proc = subprocess.Popen([sys.executable, "-m", "sbcli", "serve", str(learner), "--port", str(port),
                             "--reload-interval", "0", *extra], env=env, stdout=subprocess.DEVNULL, stderr=log)
    url, peak = f"http://127.0.0.1:{port}", [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss_mib(proc.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        while not ready(url):
            if proc.poll() is not None or time.perf_counter() - began > TIMEOUT_S:
                raise RuntimeError(f"sb serve ({code}) did not become ready: {(cache / 'serve.log').read_text()[-1000:]}")
            time.sleep(0.05)
        return time.perf_counter() - began, peak[0], proc, url
    finally:
        stop.set()
        sampler.join()
        log.close()


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(name: str, code: Path, learner: Path, extra: list[str]) -> dict[str, float | str]:
    if "--metrics-port" in (code / "sbcli" / "cli" / "serve.py").read_text():
        extra = [*extra, "--metrics-port", "0"]  # no second listener: the default 8002 may be taken
    with tempfile.TemporaryDirectory(prefix="sbcli-serve-start-") as cache:
        cold_s, cold_peak, proc, url = start(code, learner, Path(cache), extra)
        try:
            first_old_s = infer_version(url, learner.name, 1)
        finally:
            stop_server(proc)
        warm_s, warm_peak, proc, _ = start(code, learner, Path(cache), extra)
        stop_server(proc)
    return {"code": name, "cold_ready_s": round(cold_s, 2), "cold_peak_mib": round(cold_peak, 1),
            "first_request_for_step_1_s": round(first_old_s, 2), "warm_ready_s": round(warm_s, 2),
            "warm_peak_mib": round(warm_peak, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", action="append", default=[], metavar="NAME=FOLDER",
                        help="a name and the folder holding the sbcli package to run (default: this checkout)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--width", type=float, default=0.25)
    parser.add_argument("--classes", type=int, default=5, help="new classes a step")
    parser.add_argument("--serve-args", default="", help="more options for sb serve, for every code")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    codes = [(c.split("=", 1)[0], Path(c.split("=", 1)[1])) for c in args.code] or [("this", Path(__file__).parents[1])]
    with tempfile.TemporaryDirectory(prefix="sbcli-serve-start-learner-") as root:
        learner = learner_with_steps(Path(root) / "learner", args.steps, args.width, args.classes)
        rows = [measure(name, code, learner, args.serve_args.split()) for name, code in codes]
    print(f"sb serve LEARNER: {args.steps} kept steps, ResNet-18 x{args.width}, 32 px, {os.cpu_count()} CPUs")
    print(f"{'code':<10} {'cold ready s':>12} {'cold peak MiB':>14} {'1st req step 1 s':>17} {'warm ready s':>13} "
          f"{'warm peak MiB':>14}")
    for r in rows:
        print(f"{r['code']:<10} {r['cold_ready_s']:>12} {r['cold_peak_mib']:>14} {r['first_request_for_step_1_s']:>17} "
              f"{r['warm_ready_s']:>13} {r['warm_peak_mib']:>14}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
