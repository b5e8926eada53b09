"""Two settings of `sb bench`, each run over the same seeds: per cell, both accuracies and their paired difference.

Each argument is a comma-separated list of `sb bench --out` directories, one per seed, in the same
seed order for both settings (A and B); every directory must hold a finished grid (``table.json``).
For every method and task count the script prints the average incremental accuracy over steps
2..T (the paper's Table 1 metric) of each seed under A and under B, their means and sample standard
deviations, and the per-seed difference B - A with its mean and standard deviation.

Example (docs/lab/performance.md: float32 against bf16 autocast, three seeds):

    python benchmarks/compare_benches.py runs/fp32-s0,runs/fp32-s1,runs/fp32-s2 \\
        runs/bf16-s0,runs/bf16-s1,runs/bf16-s2 --names fp32,bf16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

METRIC = "avg_2_to_T"


def load(directories: str) -> list[dict]:
    """The ``table.json`` of each directory (one per seed)."""
    tables = []
    for d in directories.split(","):
        path = Path(d) / "table.json"
        if not path.is_file():
            sys.exit(f"{path} does not exist: run (or finish) `sb bench --out {d}` first.")
        tables.append(json.loads(path.read_text(encoding="utf-8")))
    return tables


def cell_values(tables: list[dict], method: str, tasks: str) -> list[float]:
    """The metric of one cell in every seed's table."""
    values = []
    for table in tables:
        row = next((r for r in table["methods"] if r["name"] == method), None)
        cell = None if row is None else row["cells"].get(tasks)
        if cell is None:
            sys.exit(f"a table lacks the cell {method}, {tasks} tasks: compare grids of the same methods and tasks.")
        values.append(cell[METRIC])
    return values


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):.2f} ± {sd:.2f}"


def compare(a: list[dict], b: list[dict], names: tuple[str, str]) -> str:
    """A Markdown table: per cell, A's and B's per-seed values and means, and the paired difference."""
    if len(a) != len(b):
        sys.exit(f"{len(a)} directories for {names[0]} but {len(b)} for {names[1]}: give one per seed for both.")
    seeds = len(a)
    lines = [f"| method | tasks | setting | {' | '.join(f'seed {i}' for i in range(seeds))} | mean ± sd |",
             "|---|---|---|" + "---|" * seeds + "---|"]
    for row in a[0]["methods"]:
        for tasks in row["cells"]:
            va, vb = cell_values(a, row["name"], tasks), cell_values(b, row["name"], tasks)
            diff = [y - x for x, y in zip(va, vb, strict=True)]
            for name, values, fmt in ((names[0], va, ".2f"), (names[1], vb, ".2f"), (f"{names[1]} - {names[0]}", diff, "+.2f")):
                cells = " | ".join(format(v, fmt) for v in values)
                lines.append(f"| {row['label']} | {tasks} | {name} | {cells} | {mean_sd(values)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="setting A: bench directories, one per seed, comma-separated")
    p.add_argument("b", help="setting B: bench directories, one per seed (same seed order), comma-separated")
    p.add_argument("--names", default="A,B", help="labels of the two settings, e.g. fp32,bf16")
    args = p.parse_args(argv)
    names = tuple(args.names.split(","))
    if len(names) != 2:
        sys.exit("--names takes two labels separated by a comma, e.g. fp32,bf16.")
    print(f"Average incremental accuracy over steps 2..T ({METRIC}), top-1 %:\n")
    print(compare(load(args.a), load(args.b), names))


if __name__ == "__main__":
    main()
