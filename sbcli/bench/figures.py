"""The bench's figures, drawn from its ``table.json`` dict with matplotlib (the ``plots`` extra).

- :func:`accuracy_per_step`: accuracy over all seen classes after each step, one line per method,
  one panel per task count (the paper's Figures 3 and 4);
- :func:`intra_old_new`: intra-old and intra-new accuracy averaged over steps 2..T, two bars per
  method, one panel per task count (the paper's Figure 5).

matplotlib is imported inside the functions (:mod:`sbcli.run.plots`, which draws a learner's own
``accuracy.png``), with the non-interactive Agg backend.
"""

from __future__ import annotations

import math
from pathlib import Path

from sbcli.run.plots import NEW_COLOR, OLD_COLOR, available, figure, save_figure

__all__ = ["accuracy_per_step", "available", "intra_old_new"]

# One colour per row, kept across figures; S&B stands out, the oracle is a dashed reference.
STYLE = {
    "finetune": {"color": "#8c8c8c", "marker": "v"},
    "std-icarl": {"color": "#9467bd", "marker": "D"},
    "std-bic": {"color": "#ff7f0e", "marker": "s"},
    "std-wa": {"color": "#1f77b4", "marker": "o"},
    "dd-wa": {"color": "#2ca02c", "marker": "^"},
    "sb-wa": {"color": "#d62728", "marker": "*", "markersize": 10, "linewidth": 2.4},
    "joint": {"color": "#222222", "marker": "", "linestyle": "--"},
}


def _subtitle(table: dict) -> str:
    run, seq = table["budget"]["run"], table["budget"]["sequence"]
    classes = seq.get("classes") or "all"
    return (f"{table['dataset']}, {classes} classes · {run['arch']} ×{run['width']} · "
            f"{run['train']['epochs']} epoch{'' if run['train']['epochs'] == 1 else 's'}/phase · memory {run['memory']}")


def _panels(count: int, width: float, height: float):
    fig = figure(width * count, height)
    return fig, list(fig.subplots(1, count, squeeze=False)[0])


def accuracy_per_step(table: dict, path: Path) -> Path:
    """Draw accuracy after each step vs classes seen; returns ``path``."""
    fig, axes = _panels(len(table["task_counts"]), 4.6, 4.0)
    for ax, tasks in zip(axes, table["task_counts"], strict=True):
        for row in table["methods"]:
            cell = row["cells"].get(str(tasks))
            if cell is None:
                continue
            style = {"linewidth": 1.6, "markersize": 6, **STYLE.get(row["name"], {})}
            ax.plot(cell["classes"], cell["accuracy"], label=row["label"], **style)
        ax.set_title(f"{tasks} tasks", fontsize=11)
        ax.set_xlabel("classes seen")
        ax.grid(alpha=0.3)
        ax.set_xticks(_ticks(table, tasks))
    axes[0].set_ylabel("top-1 accuracy over seen classes (%)")
    _legend(fig, axes)
    fig.suptitle("Accuracy after each step · " + _subtitle(table), fontsize=10)
    return save_figure(fig, path)


def _ticks(table: dict, tasks: int) -> list[int]:
    for row in table["methods"]:
        cell = row["cells"].get(str(tasks))
        if cell is not None:
            return cell["classes"]
    return []


def _legend(fig, axes) -> None:
    handles, labels = [], []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 7), frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, 0.09, 1, 0.94))


def intra_old_new(table: dict, path: Path) -> Path:
    """Draw intra-old and intra-new accuracy (mean over steps 2..T) per method; returns ``path``."""
    rows = [r for r in table["methods"] if r["cells"]]
    fig, axes = _panels(len(table["task_counts"]), max(4.0, 0.75 * len(rows) + 1.2), 4.2)
    for ax, tasks in zip(axes, table["task_counts"], strict=True):
        present = [r for r in rows if str(tasks) in r["cells"]]
        for i, row in enumerate(present):
            cell = row["cells"][str(tasks)]
            for offset, key, color in ((-0.2, "intra_old", OLD_COLOR), (0.2, "intra_new", NEW_COLOR)):
                _bar(ax, i + offset, cell[key], color, "intra-old" if key == "intra_old" else "intra-new")
        ax.set_xticks(range(len(present)))
        ax.set_xticklabels([r["label"] for r in present], rotation=35, ha="right", fontsize=9)
        ax.set_ylim(0, 105)
        ax.set_title(f"{tasks} tasks", fontsize=11)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("accuracy within old / within new classes (%)")
    _legend(fig, axes)
    fig.suptitle("Intra-old and intra-new accuracy, mean over steps 2..T · " + _subtitle(table), fontsize=10)
    return save_figure(fig, path)


def _bar(ax, x: float, value: float | None, color: str, label: str) -> None:
    if value is None or math.isnan(value):
        return
    ax.bar(x, value, width=0.38, color=color, label=label)
    ax.text(x, value + 1, f"{value:.0f}", ha="center", va="bottom", fontsize=7)
