"""Wall time of the bundled demo (`sb train`) alone, and of two demos started together.

Each run writes its own learner under ``--out`` and its log beside it. ``--sb`` is the command
that runs sbcli (the code under test), e.g. ``"python -m sbcli"`` from a checkout or ``sb``.
``--keep-env`` leaves OMP_WAIT_POLICY/KMP_BLOCKTIME/GOMP_SPINCOUNT/OMP_NUM_THREADS as they are in the caller's
environment; by default they are removed so that sbcli's own choice is measured.

Example::

    python benchmarks/demos_side_by_side.py --sb "python -m sbcli" --label after --out /tmp/demos
    python benchmarks/demos_side_by_side.py --label mini --train-args "--tasks 2 --epochs 1"
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

THREAD_VARS = ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "SBCLI_THREADS")


def _start(sb: list[str], out: Path, env: dict[str, str], extra: list[str]) -> tuple[subprocess.Popen, float]:
    shutil.rmtree(out, ignore_errors=True)
    log = out.with_suffix(".log").open("w")
    return subprocess.Popen([*sb, "train", "--out", str(out), *extra], stdout=log, stderr=subprocess.STDOUT, env=env), time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sb", default="python -m sbcli")
    parser.add_argument("--label", default="run")
    parser.add_argument("--out", type=Path, default=Path("/tmp/sbcli-demos"))
    parser.add_argument("--together", type=int, default=2, help="demos started together in the second part")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before a demo is stopped and reported as such")
    parser.add_argument("--keep-env", action="store_true")
    parser.add_argument("--train-args", default="", help='more `sb train` options, e.g. "--tasks 2 --epochs 1"')
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ) if args.keep_env else {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    sb = shlex.split(args.sb)
    for count in (1, args.together):
        runs = [_start(sb, args.out / f"{args.label}-{count}x-{i}", env, shlex.split(args.train_args)) for i in range(count)]
        pending = dict(enumerate(runs))
        while pending:
            time.sleep(0.5)
            for i, (proc, start) in list(pending.items()):
                elapsed = time.perf_counter() - start
                if proc.poll() is not None:
                    print(f"{args.label}: {count} started together, demo {i}: {elapsed:.1f} s (exit {proc.returncode})",
                          flush=True)
                    del pending[i]
                elif elapsed > args.timeout:
                    proc.kill()
                    proc.wait()
                    print(f"{args.label}: {count} started together, demo {i}: stopped after {elapsed:.0f} s "
                          "(not finished)", flush=True)
                    del pending[i]

if __name__ == "__main__":
    main()
