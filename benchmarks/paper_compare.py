"""Does S&B + WA beat STD + WA at a paper-like scale? One run on the 32 px Tiny-ImageNet-100.

The comparison: 10 tasks of 10 classes, class order seed 0, ResNet-18 at full width,
memory 2000 (random exemplars), batch 256, the paper's SGD (lr 0.1, Nesterov momentum 0.9, weight
decay 5e-4) and schedule shape (x0.1 at 30/60/80 % of every phase), the last epoch kept, and
rho 1.15, the paper's value for 10 tasks of CIFAR-100 (100 classes at 32 px, 10 a task: the same
shape as this data). Rows, trained in this order:

* ``sb-wa``: S&B + WA, through ``sb bench`` (:func:`sbcli.bench.run_bench`);
* ``std-wa``: STD + WA, also a ``sb bench`` cell, same budget;
* ``std-wa-equal`` (the equal-compute control, when it fits): STD + WA whose every step trains
  as many epochs as S&B's step did in all its phases (3x in a split step), read from S&B's history.

Before training, one epoch of a teacher-guided phase is timed on the real images ("measure one
epoch first"), and with ``--budget-s`` the epochs per phase are the most that fit it for the rows
(the control only when it still gets ``--min-epochs``); without one, every row trains ``--epochs``
(30 by default). Every finished row is written at once,
so a run stopped at its time limit leaves what it finished: ``compare.md`` and ``compare.json``
(per-step curves, average incremental accuracy over steps 2..T and 1..T, last step,
intra-old / intra-new, the S&B ablation after B, after C and after WA, S&B minus STD beside the
paper's differences), ``learner-<row>.json`` (each learner's history: the evidence) and the two
figures of ``sb bench``. The learners themselves (45 MB of weights each) stay on the machine.

Examples::

    python benchmarks/paper_compare.py --data PATH/tiny-imagenet-100-32px.zip --out compare-results --epochs 30
    python benchmarks/paper_compare.py --dry --out /tmp/compare-dry      # tiny sizes on the CPU, a minute
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from sbcli import api
from sbcli.bench import BenchPlan, run_bench
from sbcli.data.catalog import open_spec, resolve_spec
from sbcli.data.device import DeviceData
from sbcli.engine.loop import Engine, Phase, ProgressEvent, TrainConfig
from sbcli.methods.teachers import frozen_copy
from sbcli.methods.split_bridge import bridge_loss
from sbcli.nets import create_model
from sbcli.nets.partition import make_partition

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_report import ROWS, build_report, report_markdown  # noqa: E402
from gpu_data import DATA_NAME, unpack, write_tiny_archive  # noqa: E402

# docs/method.md §6: Nesterov SGD, x0.1 at 30/60/80 % of every phase; no warm-up, the last epoch kept
# (no validation split, no test-set selection), the plain residual init.
PAPER_TRAIN = {"momentum": 0.9, "weight_decay": 5e-4, "milestones": (0.3, 0.6, 0.8), "lr_decay": 0.1,
               "warmup_epochs": 0.0, "val_fraction": 0.0, "zero_init_residual": False}


DEFAULT_EPOCHS = 30  # per phase without a time budget: the least the paper-scale question asks for


class TimeUp(Exception):
    """Raised from the progress callback once the run's hard deadline has passed."""


@dataclass(frozen=True)
class CompareConfig:
    """What the comparison trains and how long it may take."""

    train: Path
    test: Path
    out: Path
    tasks: int = 10
    classes: int | None = None  # the first N classes of the order (None: all)
    order_seed: int = 0
    width: float = 1.0
    batch_size: int = 256
    memory: int = 2000
    lr: float = 0.1
    rho: float = 1.15  # the paper's rho for 10 tasks of CIFAR-100 (docs/method.md §6)
    precision: str = "auto"
    device: str = "auto"
    seed: int = 0
    epochs: int | None = None  # per phase; None: as many as fit the budget (DEFAULT_EPOCHS without one)
    budget_s: float | None = None  # the whole comparison, decoding and calibration included; None: no limit
    min_epochs: int = 10  # the control row runs only if it leaves every row at least this many
    max_epochs: int = 200  # the paper's
    control: str = "auto"  # auto (if it fits), yes, no
    overhead_s_per_step: float = 4.0  # evaluation, memory update and saving of one step (a guess; recorded)
    reserve_s: float = 45.0  # kept back for the CPU evaluation and the outputs
    calibration_images: int = 7000  # a later step's size: 10 classes x 500 + 2000 exemplars
    cpu_eval: bool = True
    plots: bool = True
    main_rows: tuple[str, ...] = ("sb-wa", "std-wa")  # ("sb-wa",): S&B + WA alone (gpu_check --sequence sb)


# ---------------------------------------------------------------------------------------------
# Planning: one measured epoch, then the epochs that fit
# ---------------------------------------------------------------------------------------------


def calibrate(cfg: CompareConfig, images: torch.Tensor, labels: torch.Tensor, norm) -> dict:
    """Images per second of a teacher-guided phase (phase C's loss) on ``images``: one epoch after a warm-up."""
    device = api.resolve_device(cfg.device)
    per_task = max(2, (cfg.classes or int(labels.max()) + 1) // cfg.tasks)
    torch.manual_seed(cfg.seed)
    model = create_model("resnet18", 2 * per_task, cfg.width).to(device)
    teacher = frozen_copy(model)
    idx = torch.randperm(len(labels))[: cfg.calibration_images]
    data = DeviceData(images[idx].to(device), (labels[idx] % (2 * per_task)).to(device))
    engine = Engine(TrainConfig(epochs=1, batch_size=cfg.batch_size, precision=cfg.precision), device, norm, cfg.seed)
    phase = Phase("C", bridge_loss(per_task, 0.5), 1, teacher=teacher)
    warm = engine.run(model, data, phase)  # cuDNN autotuning, allocator growth
    timed = engine.run(model, data, phase)
    return {"images": len(idx), "warmup_s": round(warm.seconds, 2), "epoch_s": round(timed.seconds, 3),
            "images_per_s": timed.images_per_s, "precision": timed.precision,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__}


def step_images(class_counts: list[int], order: list[int], tasks: int, memory: int) -> list[int]:
    """Training images of every step: the new classes' images plus the exemplars (at most ``memory``)."""
    per_task = len(order) // tasks
    sizes = []
    for t in range(tasks):
        new = sum(class_counts[c] for c in order[t * per_task : (t + 1) * per_task])
        old = sum(class_counts[c] for c in order[: t * per_task])
        sizes.append(new + min(memory, old))
    return sizes


def split_steps(tasks: int, per_task: int, rho: float, width: float) -> list[bool]:
    """Which steps S&B splits (three phases) rather than trains once (bf = 1), as its partition decides."""
    model = create_model("resnet18", per_task, width)
    split = [False]
    for t in range(1, tasks):
        model.expand_classes(per_task)
        split.append(make_partition(model, rho, t * per_task).is_split)
    return split


def row_image_epochs(images: list[int], split: list[bool]) -> dict[str, int]:
    """Images trained per epoch-of-a-phase, over the whole sequence, for each row."""
    sb = sum(n * (3 if s else 1) for n, s in zip(images, split, strict=True))
    return {"sb-wa": sb, "std-wa": sum(images), "std-wa-equal": sb}


def fit_epochs(cfg: CompareConfig, rate: float, image_epochs: dict[str, int], seconds: float) -> tuple[int, list[str]]:
    """The epochs per phase and the rows that fit ``seconds`` of training at ``rate`` images/s.

    The two main rows always run; the control joins when every row still gets ``min_epochs``
    (``control`` yes/no forces it). A given ``epochs`` is used as it is.
    """
    main, full = list(cfg.main_rows), [*cfg.main_rows, "std-wa-equal"]
    if math.isinf(seconds):  # no budget: every row, at the given epochs or DEFAULT_EPOCHS
        rows = full if "sb-wa" in main and cfg.control != "no" else main
        return (cfg.epochs if cfg.epochs is not None else DEFAULT_EPOCHS), rows
    overhead = cfg.overhead_s_per_step * cfg.tasks

    def fits(rows: list[str]) -> int:
        usable = seconds - overhead * len(rows)
        per_epoch = sum(image_epochs[r] for r in rows) / max(rate, 1e-9)
        return max(1, min(cfg.max_epochs, math.floor(usable / per_epoch))) if usable > 0 else 1

    with_control = "sb-wa" in main and (cfg.control == "yes" or (cfg.control == "auto" and fits(full) >= cfg.min_epochs))
    rows = full if with_control else main
    return (cfg.epochs if cfg.epochs is not None else fits(rows)), rows


# ---------------------------------------------------------------------------------------------
# Training the rows
# ---------------------------------------------------------------------------------------------


def progress_printer(deadline: float, every: int) -> Callable[[ProgressEvent], None]:
    """Print every ``every``-th epoch (and each phase's last) and stop the run once ``deadline`` passes."""

    def show(e: ProgressEvent) -> None:
        if e.epoch % every == 0 or e.epoch == e.epochs:
            print(f"  task {e.task} phase {e.phase} epoch {e.epoch}/{e.epochs} loss {e.loss:.3f} "
                  f"{e.images_per_s:,.0f} img/s ({e.precision})", file=sys.stderr, flush=True)
        if time.monotonic() > deadline:
            raise TimeUp

    return show


def options(cfg: CompareConfig, epochs: int) -> tuple[api.SequenceOptions, api.RunOptions]:
    seq = api.SequenceOptions(source=str(cfg.train), test=str(cfg.test), image_size=32, order_seed=cfg.order_seed,
                              classes=cfg.classes)
    known = {f.name for f in dataclasses.fields(TrainConfig)}  # pinned, whatever the defaults become
    paper = {k: v for k, v in PAPER_TRAIN.items() if k in known}
    train = TrainConfig(epochs=epochs, batch_size=cfg.batch_size, lr=cfg.lr, precision=cfg.precision, **paper)
    run = api.RunOptions(arch="resnet18", width=cfg.width, train=train, memory=cfg.memory, selection="random",
                         seed=cfg.seed, device=cfg.device)
    return seq, run


def cell(out: Path, row: str, tasks: int) -> Path:
    return out / "cells" / f"{row}-T{tasks}"


def run_main_rows(cfg: CompareConfig, epochs: int, work: Path, show: Callable) -> list[Path]:
    """S&B + WA, then STD + WA, as one ``sb bench`` grid; the table and figures land in ``work``."""
    seq, run = options(cfg, epochs)
    plan = BenchPlan(cfg.main_rows, (cfg.tasks,), seq, run, rho=cfg.rho)
    result = run_bench(plan, work, plots=cfg.plots, on_progress=show,
                       on_cell=lambda c, i, n, a: print(f"row {i}/{n}: {c.method} ({a})", file=sys.stderr, flush=True))
    return [f for f in result.files if f.suffix == ".png"]


def run_control(cfg: CompareConfig, epochs: int, work: Path, show: Callable) -> None:
    """STD + WA whose step t trains as many epochs as S&B's step t did over its phases."""
    history = json.loads((cell(work, "sb-wa", cfg.tasks) / "learner.json").read_text())["history"]
    per_step = [sum(p["epochs"] for p in h["phases"]) for h in history]
    seq, run = options(cfg, per_step[0])
    seq = dataclasses.replace(seq, tasks=cfg.tasks)
    run = dataclasses.replace(run, method="std", method_options={"inference": "wa"})
    out = cell(work, "std-wa-equal", cfg.tasks)
    print(f"row 3/3: std-wa-equal, epochs per step {per_step}", file=sys.stderr, flush=True)
    start = 0
    while start < len(per_step):
        stop = start
        while stop + 1 < len(per_step) and per_step[stop + 1] == per_step[start]:
            stop += 1
        if start:  # the learner's later steps train with the epochs its state records
            _set_epochs(out, per_step[start])
        _train_until(seq, run, out, stop + 1, resume=start > 0, show=show)
        start = stop + 1


def _set_epochs(out: Path, epochs: int) -> None:
    """Record ``epochs`` as the learner's epochs a step: its current step saved again (learner.json and the
    step's hashed record agree, as every load checks)."""
    from sbcli.learner.state import Learner
    from sbcli.learner.store.lock import writer_lock

    learner = Learner.load(out, "cpu")
    learner.state.train_config = dataclasses.replace(learner.state.train_config, epochs=epochs)
    with writer_lock(out, "train"):
        learner.save(out)


class _StepsDone(Exception):
    pass


def _train_until(seq, run, out: Path, steps: int, *, resume: bool, show: Callable) -> None:
    def stop(summary) -> None:
        if summary.step >= steps and summary.step < seq.tasks:
            raise _StepsDone

    try:
        api.train(seq, run, out, resume=resume, on_progress=show, on_step=stop)
    except _StepsDone:
        pass


# ---------------------------------------------------------------------------------------------
# The whole run
# ---------------------------------------------------------------------------------------------


def publish(report: dict, work: Path, results: Path, figures: list[Path], prefix: str | None = "compare") -> None:
    """Write the report (``<prefix>.json``, ``.md``; none without a prefix) and copy each learner's
    learner.json and the figures into ``results``."""
    results.mkdir(parents=True, exist_ok=True)
    if prefix is not None:
        (results / f"{prefix}.json").write_text(json.dumps(report, indent=2, allow_nan=True) + "\n", encoding="utf-8")
        (results / f"{prefix}.md").write_text(report_markdown(report), encoding="utf-8")
    for row in ROWS:
        source = cell(work, row, report["config"]["tasks"]) / "learner.json"
        if source.is_file():
            shutil.copyfile(source, results / f"learner-{row}.json")
    for fig in figures:
        if fig.is_file():
            shutil.copyfile(fig, results / fig.name)


def run_compare(cfg: CompareConfig, work: Path, prefix: str | None = "compare",
                on_report: Callable[[dict], None] | None = None) -> dict:
    """Calibrate, plan, train the rows (publishing after each) and evaluate S&B's learner on the CPU.

    ``on_report`` is also given the report after each publication (gpu_check records it).
    """
    start = time.monotonic()
    deadline = start + (math.inf if cfg.budget_s is None else cfg.budget_s)
    spec = resolve_spec(str(cfg.train), test=str(cfg.test), image_size=32, data_root=None, download=False)
    opened = open_spec(spec)  # decodes once into the cache that the rows read
    decoded_s = time.monotonic() - start
    from sbcli.data.catalog import compute_normalization

    calib = calibrate(cfg, opened.train.images, opened.train.labels, compute_normalization(opened.train.images))
    scenario = api.sequence_scenario(dataclasses.replace(options(cfg, 1)[0], tasks=cfg.tasks), len(opened.train.class_names))
    counts = torch.bincount(opened.train.labels, minlength=len(opened.train.class_names)).tolist()
    images = step_images(counts, scenario.order, cfg.tasks, cfg.memory)
    split = split_steps(cfg.tasks, len(scenario.order) // cfg.tasks, cfg.rho, cfg.width)
    cost = row_image_epochs(images, split)
    train_s = deadline - time.monotonic() - cfg.reserve_s
    epochs, rows = fit_epochs(cfg, calib["images_per_s"], cost, train_s)
    plan = {"decode_s": round(decoded_s, 1), "calibration": calib, "step_images": images, "split_steps": split,
            "image_epochs_per_epoch": cost, "training_budget_s": round(train_s, 1), "epochs": epochs, "rows": rows,
            "projected_s": {r: round(cost[r] * epochs / calib["images_per_s"], 1) for r in rows}}
    print(f"plan: {json.dumps(plan)}", file=sys.stderr, flush=True)
    show = progress_printer(deadline, max(1, epochs // 4))
    figures: list[Path] = []
    stopped = None
    try:
        figures = run_main_rows(cfg, epochs, work, show)
        partial = build_report(cfg_json(cfg), plan, work, {})
        publish(partial, work, cfg.out, figures, prefix)
        if on_report:
            on_report(partial)
        if "std-wa-equal" in rows:
            run_control(cfg, epochs, work, show)
    except TimeUp:
        stopped = f"stopped at the time budget ({cfg.budget_s:.0f} s); unfinished rows are partial"
    extra = {"stopped": stopped, "wall_s": round(time.monotonic() - start, 1)}
    if cfg.cpu_eval and stopped is None and deadline - time.monotonic() > 20:
        extra["cpu_evaluation"] = cpu_evaluation(cell(work, "sb-wa", cfg.tasks))
    report = build_report(cfg_json(cfg), plan, work, extra)
    publish(report, work, cfg.out, figures, prefix)
    if on_report:
        on_report(report)
    return report


def cpu_evaluation(learner: Path) -> dict:
    """``sb evaluate --device cpu`` of a learner against the accuracy its training recorded."""
    start = time.perf_counter()
    result = api.evaluate(learner, device="cpu")
    trained = result.history[-1].metrics.overall
    return {"learner": learner.name, "trained_overall": trained, "cpu_overall": result.metrics.overall,
            "same": result.metrics.overall == trained, "test_images": result.test_images,
            "seconds": round(time.perf_counter() - start, 1)}


def cfg_json(cfg: CompareConfig) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(cfg).items()}


def parse(argv: list[str] | None = None) -> tuple[CompareConfig, Path, Path | None, bool]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=False, default=None, help=f"the 32 px archive ({DATA_NAME}.zip)")
    p.add_argument("--out", type=Path, default=Path("compare-results"), help="where the tables and learner.json files go")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "sbcli-compare",
                   help="data and learners (large)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="time budget of the whole comparison, seconds (default: none)")
    p.add_argument("--epochs", type=int, default=None,
                   help=f"per phase (default: as many as fit --budget-s, or {DEFAULT_EPOCHS} without one)")
    p.add_argument("--min-epochs", type=int, default=10)
    p.add_argument("--control", choices=("auto", "yes", "no"), default="auto")
    p.add_argument("--rho", type=float, default=1.15)
    p.add_argument("--seed", type=int, default=0, help="initialisation and batches (the class order stays seed 0's)")
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"))
    p.add_argument("--no-cpu-eval", action="store_true")
    p.add_argument("--dry", action="store_true", help="tiny sizes on a generated archive (CPU, about a minute)")
    a = p.parse_args(argv)
    return a, a.work, a.data, a.dry


def dry_config(cfg: CompareConfig) -> CompareConfig:
    """The same run at tiny sizes: 3 tasks of 2 generated classes, 1/8 width, one epoch a phase; every
    row of the full run (the control too, unless S&B runs alone)."""
    control = "yes" if "std-wa" in cfg.main_rows else cfg.control
    return dataclasses.replace(cfg, tasks=3, width=0.125, batch_size=8, memory=12, epochs=1, control=control,
                               overhead_s_per_step=0.5, reserve_s=5.0, calibration_images=24, rho=1.0)


def main(argv: list[str] | None = None) -> None:
    a, work, data, dry = parse(argv)
    work.mkdir(parents=True, exist_ok=True)
    if dry:
        torch.set_num_threads(1)
        data = write_tiny_archive(work / "tiny.zip")
    elif data is None or not data.is_file():
        sys.exit(f"{data or 'no --data given'}: give --data, the path of {DATA_NAME}.zip (docs/lab/performance.md, On a GPU).")
    train, test = unpack(data, work / "data")
    cfg = CompareConfig(train=train, test=test, out=a.out, budget_s=a.budget_s, epochs=a.epochs, min_epochs=a.min_epochs,
                        control=a.control, rho=a.rho, seed=a.seed, device=a.device, precision=a.precision, cpu_eval=not a.no_cpu_eval)
    report = run_compare(dry_config(cfg) if dry else cfg, work / "runs")
    print(report_markdown(report))


if __name__ == "__main__":
    main()
