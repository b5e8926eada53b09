"""Tables (markdown) from benchmarks/own_data_gpu.py's ``results.jsonl`` files.

    python benchmarks/own_data_report.py benchmarks/results/own-data-h200/*-results.jsonl

Per group and variant, over the seeds that finished (mean, and min-max): the first step, the last
step's accuracy with its old and new classes, the average incremental accuracy over steps 2..T (the
paper's) and the mean old and new accuracy over steps 2..T; then, per variant, old / new per step.
A run that was stopped at the budget's end counts only where it has every step.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path


def load(paths: list[Path]) -> list[dict]:
    runs = []
    for path in paths:
        for line in path.read_text().splitlines():
            run = json.loads(line)
            if run.get("steps") and run.get("status") in ("ok", "killed"):
                runs.append(run)
    return runs


def complete(runs: list[dict]) -> list[dict]:
    """Runs with as many steps as the longest run of their group and variant."""
    longest: dict[tuple, int] = defaultdict(int)
    for r in runs:
        key = (r["group"], r.get("variant"))
        longest[key] = max(longest[key], len(r["steps"]))
    return [r for r in runs if len(r["steps"]) == longest[(r["group"], r.get("variant"))]]


def mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def cell(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return "–"
    return f"{mean(xs):.1f}" if len(xs) == 1 else f"{mean(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


def summary(runs: list[dict]) -> dict:
    later = [r["steps"][1:] for r in runs]
    return {"seeds": ",".join(str(r.get("seed")) for r in sorted(runs, key=lambda r: r.get("seed", 0))),
            "first": cell([r["steps"][0]["overall"] for r in runs]),
            "last": cell([r["steps"][-1]["overall"] for r in runs]),
            "last old / new": f"{cell([r['steps'][-1]['old'] for r in runs])} / {cell([r['steps'][-1]['new'] for r in runs])}",
            "avg 2..T": cell([mean([s["overall"] for s in steps]) for steps in later]),
            "old 2..T / new 2..T": f"{cell([mean([s['old'] for s in steps]) for steps in later])} / "
                                   f"{cell([mean([s['new'] for s in steps]) for steps in later])}",
            "seconds": cell([r["seconds"] for r in runs])}


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def per_step(runs: list[dict]) -> str:
    steps = len(runs[0]["steps"])
    cells = []
    for i in range(steps):
        old = mean([r["steps"][i]["old"] for r in runs])
        new = mean([r["steps"][i]["new"] for r in runs])
        cells.append(f"{mean([r['steps'][i]['overall'] for r in runs]):.1f}"
                     + ("" if math.isnan(old) else f" ({old:.1f} / {new:.1f})"))
    return " | ".join(cells)


def per_seed(runs: list[dict]) -> list[dict]:
    """One row a run: the first step and its last phase's loss, avg 2..T, the last step's intra-old and
    intra-new, the balancing phase's last loss at the last step, and the phases' images per second."""
    rows = []
    for r in sorted(runs, key=lambda r: (r.get("variant") or "", r.get("seed") or 0)):
        first, last = r["steps"][0], r["steps"][-1]
        later = [s["overall"] for s in r["steps"][1:]]
        balance = [p["final_loss"] for p in last["phases"] if p["name"] == "balance"]
        rates = [p["images_per_s"] for s in r["steps"] for p in s["phases"] if p.get("images_per_s")]
        rows.append({"run": r["name"], "first": f"{first['overall']:.1f}",
                     "first loss": f"{first['phases'][-1]['final_loss']:.3f}",
                     "avg 2..T": f"{sum(later) / len(later):.2f}" if later else "–",
                     "last intra-old / intra-new": f"{cell([last.get('intra_old')])} / {cell([last.get('intra_new')])}",
                     "last balance loss": f"{balance[0]:.2f}" if balance else "–",
                     "img/s (phases)": f"{min(rates):,.0f}-{max(rates):,.0f}" if rates else "–"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument("--per-seed", action="store_true", help="also one row a run")
    args = parser.parse_args()
    runs = complete(load(args.results))
    groups: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        groups[r["group"]][r.get("variant") or r["name"]].append(r)
    for group, variants in groups.items():
        print(f"\n### {group}\n")
        print(table([{"variant": v, **summary(rs)} for v, rs in variants.items()]))
        longest = max(len(rs[0]["steps"]) for rs in variants.values())
        if longest > 1:
            print("\nPer step, mean over seeds: accuracy (old / new)\n")
            print("| variant | " + " | ".join(f"step {i + 1}" for i in range(longest)) + " |")
            print("|---|" + "---|" * longest)
            for v, rs in variants.items():
                print(f"| {v} | {per_step(rs)} |")
        if args.per_seed:
            print("\nPer run\n")
            print(table(per_seed([r for rs in variants.values() for r in rs])))


if __name__ == "__main__":
    main()
