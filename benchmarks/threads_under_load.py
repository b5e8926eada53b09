"""A ResNet-32 training step under an artificial CPU load, with and without passive OpenMP waiting.

Why: on a shared machine torch's default (one OpenMP thread per core, threads that spin while they
wait for each other) collapsed a training step to a fraction of what one thread does. This script
measures it side by side in one run: for each load (``--loads``: how many busy-loop processes run
beside the benchmark, e.g. 0 and one per core) and each setting, a fresh Python process times
training steps of ``create_model("resnet32")`` for ``--seconds`` and prints images/s. Settings:

* ``spin``: torch's default threads, OpenMP's default waiting (what sbcli did before);
* ``passive``: the same threads with ``OMP_WAIT_POLICY=PASSIVE`` (what sbcli set until it spun briefly);
* ``brief``: passive after a brief spin, ``GOMP_SPINCOUNT=10000`` as well (what ``sb`` sets now; GNU
  OpenMP reads the count last, so it spins 10,000 iterations, a thirtieth of its default, then sleeps);
* ``one``: one thread (``OMP_NUM_THREADS=1``).

With ``--together 1,2`` each setting is also measured as two benchmark processes started at once
(two trainings sharing the machine, as two demos started together do): the rate is per process.

Settings alternate in ``--rounds`` rounds so that other work on a shared machine slows them alike;
the median of each is reported.

Example::

    python benchmarks/threads_under_load.py --loads 0,2 --seconds 20 --rounds 3
    python benchmarks/threads_under_load.py --loads 0 --together 1,2 --seconds 20 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = {
    "spin": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "one": {"OMP_NUM_THREADS": "1"},
    "brief": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"},
}

STEP = r"""
import sys, time, torch
from sbcli.nets import create_model
seconds, batch, width = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
torch.manual_seed(0)
model = create_model("resnet32", 10, width).to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(batch, 3, 32, 32).to(memory_format=torch.channels_last)
y = torch.randint(0, 10, (batch,))
def step():
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
step(); step()
start, n = time.perf_counter(), 0
while time.perf_counter() - start < seconds:
    step(); n += 1
print(n * batch / (time.perf_counter() - start), torch.get_num_threads())
"""


def _busy(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def _measure(setting: str, seconds: float, batch: int, width: float, together: int = 1) -> tuple[float, int]:
    """Images/s of one process (the mean over ``together`` processes started at once) and its threads."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "KMP_BLOCKTIME", "GOMP_SPINCOUNT")}
    env.update(SETTINGS[setting])
    procs = [subprocess.Popen([sys.executable, "-c", STEP, str(seconds), str(batch), str(width)], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(together)]
    outs = [p.communicate()[0].split() for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a benchmark process failed in setting {setting}")
    return statistics.mean(float(o[0]) for o in outs), int(outs[0][1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="0,2", help="busy-loop processes beside the benchmark, comma-separated")
    parser.add_argument("--settings", default="spin,passive,brief,one")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=float, default=1.0)
    parser.add_argument("--together", default="1", help="benchmark processes started at once, comma-separated (e.g. 1,2)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    settings = args.settings.split(",")
    results = []
    for load in (int(v) for v in args.loads.split(",")):
        busy = _busy(load)
        try:
            time.sleep(1.0)
            cases = [(s, n) for n in (int(v) for v in args.together.split(",")) for s in settings]
            rates: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
            threads: dict[tuple[str, int], int] = {}
            for _ in range(args.rounds):
                for s, n in cases:
                    rate, threads[s, n] = _measure(s, args.seconds, args.batch_size, args.width, n)
                    rates[s, n].append(rate)
        finally:
            for p in busy:
                p.kill()
                p.wait()
        for s, n in cases:
            row = {"load": load, "setting": s, "together": n, "threads": threads[s, n],
                   "median_img_s": round(statistics.median(rates[s, n]), 1), "rates": [round(r, 1) for r in rates[s, n]]}
            results.append(row)
            print(f"load {load} busy  {s:8s} x{n} together  threads {threads[s, n]}  {row['median_img_s']:7.1f} img/s "
                  f"per process  (rounds: {', '.join(f'{r:.1f}' for r in rates[s, n])})", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cpus": os.cpu_count(), "batch_size": args.batch_size, "width": args.width,
                       "seconds": args.seconds, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
