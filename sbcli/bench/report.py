"""What a bench ran, in words: class order, epochs per step, rho, precision and threads.

Pure text helpers of :mod:`sbcli.bench`'s report (``table.md``'s "What ran" section and the
lines `sb bench` prints before it starts), and :func:`ran_on`, where this invocation trains.
"""

from __future__ import annotations

from typing import Any


def class_order_text(order_seed: int | None) -> str:
    """``seed 0``, or the dataset's own order for ``--order-seed -1`` (stored as None)."""
    return "as in the dataset (--order-seed -1)" if order_seed is None else f"seed {order_seed}"


def threads_text(table: dict) -> str:
    ran = table.get("ran") or {}
    return f" (this run: {ran['precision']} on {ran['device']}, {ran['threads']} threads)" if ran else ""


def epochs_text(epochs: list[int]) -> str:
    """``4, 12×4``: each step's epochs, repeats folded."""
    parts: list[list[int]] = []
    for e in epochs:
        if parts and parts[-1][0] == e:
            parts[-1][1] += 1
        else:
            parts.append([e, 1])
    return ", ".join(f"{e}×{n}" if n > 1 else str(e) for e, n in parts)


def what_ran(table: dict) -> list[str]:
    """A section per finished cell: total epochs of each step (every phase), S&B's rho, the precision."""
    lines = ["## What ran", "", "Epochs per step count every phase (S&B's later steps train A, B and C).", "",
             "| method | tasks | epochs per step | rho | precision |", "|---|---:|---|---:|---|"]
    for row in table["methods"]:
        for tasks in table["task_counts"]:
            cell = row["cells"].get(str(tasks))
            if cell is not None:
                rho = "–" if cell.get("rho") is None else f"{cell['rho']:g}"
                lines.append(f"| {row['label']} | {tasks} | {epochs_text(cell.get('epochs_per_step', []))} | {rho} | "
                             f"{', '.join(cell.get('precision', [])) or '–'} |")
    return [*lines, ""]


def ran_on(plan: Any) -> dict:
    """Where this invocation trains: the device, its precision as resolved, and torch's CPU threads."""
    import torch

    from sbcli.engine.hardware import resolve_device, uses_bf16

    device = resolve_device(plan.run.device)
    precision = "bf16" if uses_bf16(plan.run.train.precision, device) else "fp32"
    return {"device": str(device), "precision": precision, "threads": torch.get_num_threads()}


def ran_text(plan: Any) -> str:
    ran = ran_on(plan)
    return f"precision {plan.run.train.precision} ({ran['precision']} on {ran['device']}), {ran['threads']} threads"
