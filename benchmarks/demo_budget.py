"""The demo's budget: candidate settings of `sb train` (no source: the bundled demo), several seeds each.

    python benchmarks/demo_budget.py --out /tmp/demo-budget                      # run, then print the table
    python benchmarks/demo_budget.py --out /tmp/demo-budget --report-only        # the table of runs made before
    python benchmarks/demo_budget.py --variants 'base=' 'e8=--epochs 8' --seeds 0 1 2 --threads 2

Each run is `python -m sbcli train --out OUT/NAME-sSEED --json -q --threads T --seed SEED OPTIONS`,
one after the other (timed with the wall clock: run it on an otherwise idle machine), and the table
gives per variant the seconds, the last step's accuracy with its old and new classes per seed, and
the average incremental accuracy over steps 2..T and the
forgetting (the mean drop of each earlier task from its best to the end, as `sb train` prints). ``--threads`` fixes the arithmetic: the demo's
numbers change with the thread count (docs/lab/benchmarks.md, "The demo's budget").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_VARIANTS = ["base=", "bal2=--balance-epochs 2", "e6bal2=--epochs 6 --balance-epochs 2", "e8=--epochs 8",
                    "e8bal2=--epochs 8 --balance-epochs 2"]


def run(out: Path, name: str, seed: int, options: str, threads: int) -> None:
    learner = out / f"{name}-s{seed}"
    if (learner / "learner.json").is_file():
        return
    cmd = [sys.executable, "-m", "sbcli", "train", "--out", str(learner), "--json", "-q", "--threads", str(threads),
           "--seed", str(seed), *options.split()]
    start = time.perf_counter()
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
    (out / f"{name}-s{seed}.seconds").write_text(f"{seconds:.1f}\n")


def history(learner: Path) -> list:
    from sbcli.learner.state import read_state

    return read_state(learner).history


def report(out: Path, names: list[str], seeds: list[int]) -> str:
    from sbcli.metrics import history_summary

    rows = ["| variant | seconds (per seed) | last step: all (old / new) per seed | mean last | mean avg 2..T | mean forgetting |",
            "|---|---|---|---|---|---|"]
    for name in names:
        found = [(s, out / f"{name}-s{s}") for s in seeds if (out / f"{name}-s{s}.seconds").is_file()]  # finished
        if not found:
            continue
        secs, lasts, avgs, cells, forgetting = [], [], [], [], []
        for seed, learner in found:
            h = history(learner)
            m = h[-1].metrics
            secs.append((out / f"{name}-s{seed}.seconds").read_text().strip())
            lasts.append(m.overall)
            avgs.append(sum(x.metrics.overall for x in h[1:]) / max(1, len(h) - 1))
            cells.append(f"{m.overall:.1f} ({m.old:.1f} / {m.new:.1f})")
            forgetting.append(history_summary(h).forgetting)
        rows.append(f"| {name} | {', '.join(secs)} | {'; '.join(cells)} | {sum(lasts) / len(lasts):.1f} | "
                    f"{sum(avgs) / len(avgs):.1f} | {sum(forgetting) / len(forgetting):.1f} |")
    return "\n".join(rows)


def details(out: Path, names: list[str], seeds: list[int]) -> str:
    """One line a finished run: intra-old over steps 2..T, the accuracy before and after balancing per
    step, and (with --val-fraction) how many phases kept an earlier epoch than their last."""
    lines = []
    for name in names:
        for seed in seeds:
            learner = out / f"{name}-s{seed}"
            if not (out / f"{name}-s{seed}.seconds").is_file():
                continue
            h = history(learner)
            intra = [x.metrics.intra_old for x in h[1:]]
            balance = [f"{x.record['before_balance']['overall']:.2f} -> {x.metrics.overall:.2f}"
                       for x in h if "before_balance" in x.record]
            picked = [(p["selected_epoch"], p["epochs"]) for x in h for p in x.phases if "selected_epoch" in p]
            line = f"{name}-s{seed}: intra-old {min(intra):.1f}-{max(intra):.1f}"
            if balance:
                line += "; before -> after balancing " + ", ".join(balance)
            if picked:
                line += f"; an earlier epoch kept in {sum(e < n for e, n in picked)} of {len(picked)} phases"
            lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, help="NAME=OPTIONS")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--details", action="store_true", help="also one line a run (intra-old, balancing, selection)")
    args = parser.parse_args()
    variants = dict(v.split("=", 1) for v in args.variants)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for seed in args.seeds:
            for name, options in variants.items():
                run(args.out, name, seed, options, args.threads)
    print(report(args.out, list(variants), args.seeds))
    if args.details:
        print(details(args.out, list(variants), args.seeds))


if __name__ == "__main__":
    main()
