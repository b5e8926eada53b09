"""Tables from benchmarks/own_data_defaults.py's ``results.jsonl``: each default beside its alternative.

    python benchmarks/own_data_defaults_report.py RESULTS.jsonl [--study heads,collapse]

Per configuration and variant, over the seeds that finished, mean (min-max): the average incremental
accuracy over steps 1..T and 2..T, the last step with its old / new classes, the old classes at step
2, the intra-old accuracy of the last step (old images among old classes only), the WA factor (mean
over the later steps) and the first task with its standard deviation; then each variant's
difference from the study's first variant on the same seeds. A configuration of one task (the
collapse check) gets the first task alone, with how many runs ended within 5 points of chance.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

Study = tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]]


def load(path: Path) -> dict[tuple[str, str], dict[int, dict]]:
    """(config, variant) -> seed -> the run's figures, for the runs with every step (the last line wins)."""
    runs: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    if not path.is_file():
        return runs
    for line in path.read_text().splitlines():
        run = json.loads(line) if line.strip() else {}
        if run.get("status") == "ok" and "config" in run and len(run.get("steps") or []) >= run.get("tasks", 1):
            runs[(run["config"], run["variant"])][run["seed"]] = figures(run)
    return runs


def _mean(xs: list[float | None]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def figures(run: dict) -> dict:
    steps = run["steps"]
    later = steps[1:]
    return {"avg_all": _mean([s["overall"] for s in steps]), "avg_later": _mean([s["overall"] for s in later]),
            "last": steps[-1]["overall"], "last_old": steps[-1]["old"], "last_new": steps[-1]["new"],
            "step2_old": later[0]["old"] if later else None, "intra_old": steps[-1].get("intra_old"),
            "wa": _mean([s.get("wa_factor") for s in later]), "first": steps[0]["overall"],
            "classes": steps[0]["classes"], "seconds": run.get("seconds")}


def cell(xs: list[float | None], digits: int = 1) -> str:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return "–"
    m = sum(xs) / len(xs)
    return f"{m:.{digits}f}" if len(xs) == 1 else f"{m:.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"


def spread(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else (f"{xs[0]:.1f}" if xs else "–")


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    return "\n".join(["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys),
                      *("| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows)])


def steps_rows(runs: dict, config: str, variants: tuple[str, ...]) -> list[dict]:
    rows = []
    for v in variants:
        by_seed = runs.get((config, v), {})
        if not by_seed:
            continue
        f = list(by_seed.values())
        rows.append({"variant": v, "seeds": ",".join(map(str, sorted(by_seed))),
                     "avg 1..T": cell([x["avg_all"] for x in f]), "avg 2..T": cell([x["avg_later"] for x in f]),
                     "last (old / new)": f"{cell([x['last'] for x in f])} ({cell([x['last_old'] for x in f])} / "
                                         f"{cell([x['last_new'] for x in f])})",
                     "old at step 2": cell([x["step2_old"] for x in f]), "last intra-old": cell([x["intra_old"] for x in f]),
                     "WA factor": cell([x["wa"] for x in f], 2), "first task": spread([x["first"] for x in f])})
    return rows


def paired_rows(runs: dict, config: str, variants: tuple[str, ...]) -> list[dict]:
    """Each variant minus the first, on the seeds both finished."""
    base = runs.get((config, variants[0]), {})
    rows = []
    for v in variants[1:]:
        other = runs.get((config, v), {})
        seeds = sorted(set(base) & set(other))
        if not seeds:
            continue
        d = {k: [other[s][k] - base[s][k] for s in seeds] for k in ("avg_all", "avg_later", "last", "first")}
        d_old = [other[s]["step2_old"] - base[s]["step2_old"] for s in seeds if base[s]["step2_old"] is not None]
        rows.append({"variant - " + variants[0]: v, "seeds": ",".join(map(str, seeds)),
                     "avg 1..T": cell(d["avg_all"]), "avg 2..T": cell(d["avg_later"]), "last": cell(d["last"]),
                     "old at step 2": cell(d_old), "first task": cell(d["first"])})
    return rows


def first_task_rows(runs: dict, configs: tuple[str, ...], variants: tuple[str, ...]) -> list[dict]:
    rows = []
    for v in variants:
        f = [x for c in configs for x in runs.get((c, v), {}).values()]
        if not f:
            continue
        chance = 100.0 / f[0]["classes"]
        accs = [x["first"] for x in f]
        rows.append({"variant": v, "runs": len(f), "first task": spread(accs), "min": f"{min(accs):.1f}",
                     f"within 5 of chance ({chance:.0f})": sum(a < chance + 5 for a in accs),
                     **{c: cell([x["first"] for x in runs.get((c, v), {}).values()]) for c in configs}})
    return rows


def report(path: Path, studies: list[Study]) -> str:
    runs = load(path)
    out = []
    for configs, variants, _ in studies:
        if all(c.startswith("c5-") for c in configs):
            rows = first_task_rows(runs, configs, variants)
            if rows:
                out += [f"\n### first task alone: {', '.join(configs)}\n", table(rows)]
            continue
        for config in configs:
            rows = steps_rows(runs, config, variants)
            if not rows:
                continue
            out += [f"\n### {config}: {', '.join(variants)}\n", table(rows)]
            paired = paired_rows(runs, config, variants)
            if paired:
                out += ["\nDifference from the first variant, same seeds, mean (min-max):\n", table(paired)]
    return "\n".join(out) if out else "no finished runs yet"


def main() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from own_data_defaults import ORDER, STUDIES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--study", default="all")
    args = parser.parse_args()
    names = list(ORDER) if args.study == "all" else args.study.split(",")
    print(report(args.results, [STUDIES[s] for s in names]))


if __name__ == "__main__":
    main()
