"""The tables of benchmarks/paper_compare.py, built from the learners' histories alone.

``build_report`` reads ``<work>/cells/<row>-T<tasks>/learner.json`` of every row that exists (a row
cut short by the time limit shows the steps it finished); ``report_markdown`` prints the
tables. Both work again on the ``learner-<row>.json`` files brought back from the GPU machine
(``python benchmarks/compare_report.py DIR``), so that the tables can be printed without a GPU.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sbcli.bench import PAPER_TABLE1  # noqa: E402
from sbcli.metrics import average_incremental  # noqa: E402

ROWS = ("sb-wa", "std-wa", "std-wa-equal")
LABELS = {"sb-wa": "S&B + WA", "std-wa": "STD + WA", "std-wa-equal": "STD + WA, S&B's epochs per step"}
# The paper's S&B + WA minus STD + WA at 10 tasks (average over steps 2..T; docs/method.md §9)
PAPER_DIFF_10 = {
    "CIFAR-100, 10 tasks of 10 classes, 32 px": PAPER_TABLE1["cifar100"]["sb-wa"][2] - PAPER_TABLE1["cifar100"]["std-wa"][2],
    "Tiny-ImageNet (200 classes), 10 tasks of 20, 64 px": (PAPER_TABLE1["tiny-imagenet"]["sb-wa"][2]
                                                          - PAPER_TABLE1["tiny-imagenet"]["std-wa"][2]),
}


def row_summary(history: list[dict]) -> dict:
    """One learner's numbers: curves, both averages, last, intra-old/new, epochs and throughput per step."""
    metric = lambda key: [h["metrics"][key] for h in history]  # noqa: E731
    overall = metric("overall")
    return {
        "steps": len(history),
        "classes": [h["num_classes"] for h in history],
        "accuracy": overall,
        "avg_2_to_T": average_incremental(overall, skip_first=True),
        "avg_1_to_T": average_incremental(overall, skip_first=False),
        "last": overall[-1] if overall else math.nan,
        "old": metric("old"), "new": metric("new"),
        "intra_old": metric("intra_old"), "intra_new": metric("intra_new"),
        "epochs_per_step": [sum(p["epochs"] for p in h["phases"]) for h in history],
        "phases": [[{k: p.get(k) for k in ("name", "epochs", "seconds", "images_per_s", "precision")}
                    for p in h["phases"]] for h in history],
        "seconds": round(sum(h.get("seconds", 0.0) for h in history), 1),
    }


def ablation(history: list[dict]) -> list[dict]:
    """S&B per incremental step: overall accuracy after phase B, after phase C, after WA (the step's result)."""
    rows = []
    for h in history[1:]:
        record = h.get("record", {})
        after = {key: record.get(key, {}).get("overall", math.nan) for key in ("after_B", "after_C")}
        rows.append({"step": h["step"], "split": record.get("partition", {}).get("is_split", False), **after,
                     "after_WA": h["metrics"]["overall"]})
    return rows


def load_histories(work: Path, tasks: int) -> dict[str, list[dict]]:
    """Each row's history, from the learner directories or from ``learner-<row>.json`` files in ``work``."""
    found = {}
    for row in ROWS:
        for path in (work / "cells" / f"{row}-T{tasks}" / "learner.json", work / f"learner-{row}.json"):
            if path.is_file():
                found[row] = json.loads(path.read_text(encoding="utf-8"))["history"]
                break
    return found


def build_report(config: dict, plan: dict, work: Path, extra: dict) -> dict:
    """Everything the tables show, as JSON-able data."""
    histories = load_histories(Path(work), config["tasks"])
    rows = {r: row_summary(h) for r, h in histories.items()}
    complete = {r: s for r, s in rows.items() if s["steps"] == config["tasks"]}
    diffs = {f"S&B - {LABELS[r]}": complete["sb-wa"]["avg_2_to_T"] - complete[r]["avg_2_to_T"]
             for r in ("std-wa", "std-wa-equal") if "sb-wa" in complete and r in complete}
    calib = plan.get("calibration", {})
    return {"config": config, "plan": plan, "device": calib.get("device", "?"), "torch": calib.get("torch", "?"), "rows": rows,
            "ablation": ablation(histories["sb-wa"]) if "sb-wa" in histories else [],
            "difference_2_to_T": diffs, "paper_difference_2_to_T": PAPER_DIFF_10, **extra}


def _f(value: float | None, sign: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:+.2f}" if sign else f"{value:.2f}"


def _curves(report: dict, key: str) -> list[str]:
    rows = report["rows"]
    steps = max((s["steps"] for s in rows.values()), default=0)
    lines = ["| row | " + " | ".join(str(t + 1) for t in range(steps)) + " |", "|---|" + "---:|" * steps]
    for r, s in rows.items():
        values = s[key] + [math.nan] * (steps - s["steps"])
        lines.append(f"| {LABELS[r]} | " + " | ".join(_f(v) for v in values) + " |")
    return lines


def report_markdown(report: dict) -> str:
    """The comparison's tables as Markdown."""
    c, plan = report["config"], report["plan"]
    calib = plan.get("calibration", {})
    how = ("given" if c.get("epochs") else "the default, no time budget" if c.get("budget_s") is None
           else f"fitted to {c['budget_s']:.0f} s")
    lines = [f"# S&B + WA against STD + WA: {c['tasks']} tasks, {Path(str(c['train'])).parent.name}", "",
             f"Device: {report['device']} · torch {report['torch']} · {calib.get('precision', '?')} · one measured "
             f"epoch: {calib.get('images_per_s', 0):,.0f} img/s (phase C, {calib.get('images', '?')} images).",
             f"Budget: ResNet-18 width {c['width']}, {plan.get('epochs')} epoch(s) a phase ({how}), "
             f"batch {c['batch_size']}, lr {c['lr']}, memory {c['memory']} (random), rho {c['rho']}, class order seed "
             f"{c['order_seed']}, seed {c['seed']}, last epoch kept. Rows: {', '.join(plan.get('rows', []))}."]
    if report.get("stopped"):
        lines += ["", f"**{report['stopped']}.**"]
    lines += ["", "## Average incremental accuracy (top-1 %)", "",
              "| row | steps | avg 2..T | avg 1..T | last | intra-old (2..T) | intra-new (2..T) | epochs per step | wall s |",
              "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r, s in report["rows"].items():
        mean = lambda v: sum(v[1:]) / len(v[1:]) if len(v) > 1 else math.nan  # noqa: E731
        lines.append(f"| {LABELS[r]} | {s['steps']} | {_f(s['avg_2_to_T'])} | {_f(s['avg_1_to_T'])} | {_f(s['last'])} | "
                     f"{_f(mean(s['intra_old']))} | {_f(mean(s['intra_new']))} | "
                     f"{','.join(map(str, s['epochs_per_step']))} | {s['seconds']:.0f} |")
    lines += ["", "## S&B minus STD (avg 2..T), with the paper's differences as context (other data, 200 epochs)", "",
              "| difference | points |", "|---|---:|"]
    lines += [f"| {name} (this run) | {_f(v, sign=True)} |" for name, v in report["difference_2_to_T"].items()]
    lines += [f"| paper: {name} | {_f(v, sign=True)} |" for name, v in report["paper_difference_2_to_T"].items()]
    for key, title in (("accuracy", "Accuracy after each step"), ("intra_old", "Intra-old after each step"),
                       ("intra_new", "Intra-new after each step")):
        lines += ["", f"## {title}", "", *_curves(report, key)]
    if report["ablation"]:
        lines += ["", "## S&B ablation: overall accuracy after phase B, after phase C, after WA", "",
                  "| step | split | after B | after C | after WA |", "|---:|---|---:|---:|---:|"]
        lines += [f"| {a['step']} | {'yes' if a['split'] else 'no (bf = 1)'} | {_f(a['after_B'])} | {_f(a['after_C'])} | "
                  f"{_f(a['after_WA'])} |" for a in report["ablation"]]
    if "sb-wa" in report["rows"]:
        lines += ["", "## S&B + WA: images per second of each phase", "", "| step | phases (name: epochs, img/s) |", "|---:|---|"]
        lines += [f"| {t + 1} | " + ", ".join(f"{p['name']}: {p['epochs']}, {p['images_per_s']:,.0f}" for p in phases) + " |"
                  for t, phases in enumerate(report["rows"]["sb-wa"]["phases"])]
    if report.get("cpu_evaluation"):
        e = report["cpu_evaluation"]
        lines += ["", f"`sb evaluate --device cpu` of the S&B learner: {_f(e['cpu_overall'])} % on {e['test_images']} "
                      f"images, trained run recorded {_f(e['trained_overall'])} % ({'the same' if e['same'] else 'DIFFERENT'})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Print the tables again from a folder of brought-back files (compare.json + learner-*.json)."""
    folder = Path((argv or sys.argv[1:])[0])
    name = next(n for n in ("compare.json", "results.json") if (folder / n).is_file())
    stored = json.loads((folder / name).read_text(encoding="utf-8"))
    stored = stored.get("sequence", stored)  # gpu_check keeps it under "sequence"
    report = build_report(stored["config"], stored["plan"], folder, {k: stored.get(k) for k in ("stopped", "cpu_evaluation")})
    print(report_markdown(report))


if __name__ == "__main__":
    main()
