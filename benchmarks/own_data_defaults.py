"""Own-data defaults, each against its alternative: `sb train` runs side by side over seeds and configurations.

    PYTHONPATH=. python benchmarks/own_data_defaults.py --study heads --threads 1     # a CPU: one run at a time
    bash benchmarks/own_data_defaults.sh --study all --workers 8 --budget-s 3000      # a machine with a GPU
    PYTHONPATH=. python benchmarks/own_data_defaults.py --report                      # the tables, nothing rerun
    PYTHONPATH=. python benchmarks/own_data_defaults.py --dry                         # tiny generated data

Configurations (:data:`CONFIGS`), all on class-per-folder data as a user has it:

- ``t20``: 20 classes of the 32 px Tiny-ImageNet-100 (the last 20 in name order), 250 images a class,
  4 tasks, ResNet-32, memory 400 (herding), 10 epochs a step, batch 128, SGD lr 0.01 with momentum
  0.9, weight decay 2e-4 and drops at epochs 4, 7 and 9: PyCIL's WA recipe on this data.
- ``t20a``: the same with the first 20 classes in name order: the classes PyCIL's WA was measured on
  (25.4 to 26.9 % averaged over steps 1..4), so its ``pycil`` study sets the defaults against it.
- ``t20x30``: ``t20`` at 30 epochs a step (a folder's default), for the lr study.
- ``t50``: the first 50 classes, 250 a class, 10 tasks, ResNet-18 x0.25, memory 500, 5 epochs a step.
- ``c10``: CIFAR-10 at 500 images a class, 5 tasks, ResNet-32, memory 400, 10 epochs a step.
- ``c5-K``: one task of 5 classes (subset K = 0, 1, 2 of classes 50-64), 250 a class, ResNet-32,
  batch 128, lr 0.1, 10 epochs: the configuration whose first task can end at chance.

Each study (:data:`STUDIES`) names a configuration and the variants it compares; every variant
passes all the options it is about (:data:`VARIANTS`), so a result does not depend on the defaults
of the code that ran it. Runs go through benchmarks/own_data_gpu.py's pool (``--workers`` at a time,
inside ``--budget-s``); each finished run adds a line to ``results.jsonl`` under ``--out``, and a run
already there (or a finished learner under ``--work``/runs) is not run again, so a study can be
continued and the report printed at any time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests")]
from gpu_data import unzip, write_tiny_archive  # noqa: E402
from own_data_defaults_report import report  # noqa: E402
from own_data_gpu import Pool, environment  # noqa: E402
from own_data_jobs import Job  # noqa: E402
from realdata import DATA_DIR  # noqa: E402  (the one data setting: $SBCLI_TEST_DATA)

TINY_ZIP = "tiny-imagenet-100-32px.zip"
CIFAR_ZIPS = ("cifar10-500.zip", "cifar10-jpeg.zip")  # 500 a class (gpu_data.write_subset), or the whole set (cut to 500 here)


@dataclass(frozen=True)
class Config:
    """A data set cut from an archive (classes ``first:last`` in name order, ``per_class`` training
    images each) and the `sb train` options that fix its budget."""

    archive: str
    first: int
    last: int
    per_class: int | None
    tasks: int
    epochs: int
    options: tuple[str, ...]


PYCIL = ("--batch-size", "128", "--lr", "0.01", "--momentum", "0.9", "--weight-decay", "2e-4",
         "--milestones", "0.4,0.7,0.9", "--selection", "herding")
R32 = ("--arch", "resnet32")
CONFIGS: dict[str, Config] = {
    "t20": Config(TINY_ZIP, 80, 100, 250, 4, 10, (*R32, "--memory", "400", *PYCIL)),
    "t20x30": Config(TINY_ZIP, 80, 100, 250, 4, 30, (*R32, "--memory", "400", *PYCIL)),  # a folder's 30 epochs
    "t20a": Config(TINY_ZIP, 0, 20, 250, 4, 10, (*R32, "--memory", "400", *PYCIL)),
    "t50": Config(TINY_ZIP, 0, 50, 250, 10, 5, ("--arch", "resnet18", "--width", "0.25", "--memory", "500", *PYCIL)),
    "c10": Config("cifar10", 0, 10, 500, 5, 10, (*R32, "--memory", "400", *PYCIL)),
    **{f"c5-{k}": Config(TINY_ZIP, 50 + 5 * k, 55 + 5 * k, 250, 1, 10,
                         (*R32, "--memory", "0", "--batch-size", "128", "--lr", "0.1")) for k in range(3)},
}

# name -> options; "{sb_phases}" becomes the config's epochs cut into three phases (equal compute)
_STD = ("--method", "std", "--inference", "wa", "--balance-epochs", "0")
VARIANTS: dict[str, tuple[str, ...]] = {
    "rules": (*_STD, "--first-task-rules", "--no-wa-clip", "--warmup-epochs", "0"),
    "norules": (*_STD, "--no-first-task-rules", "--no-wa-clip", "--warmup-epochs", "0"),
    "waclip": (*_STD, "--first-task-rules", "--wa-clip", "--warmup-epochs", "0"),
    "norules-warm1": (*_STD, "--no-first-task-rules", "--no-wa-clip", "--warmup-epochs", "1"),
    "waclip-warm1": (*_STD, "--first-task-rules", "--wa-clip", "--warmup-epochs", "1"),
    # the folder default lr (0.1, which brings one epoch of warm-up) instead of PyCIL's 0.01
    "waclip-lr1": (*_STD, "--first-task-rules", "--wa-clip", "--lr", "0.1", "--warmup-epochs", "1"),
    "waclip-bal2": ("--method", "std", "--inference", "wa", "--balance-epochs", "2", "--first-task-rules", "--wa-clip",
                    "--warmup-epochs", "0"),
    # the same balancing, weight aligning after it instead of before (--balance-before-wa)
    "waclip-bal2-before": ("--method", "std", "--inference", "wa", "--balance-epochs", "2", "--balance-before-wa",
                           "--first-task-rules", "--wa-clip", "--warmup-epochs", "0"),
    "sb-equal": ("--method", "sb", "--phase-epochs", "{sb_phases}", "--balance-epochs", "0", "--first-task-rules",
                 "--warmup-epochs", "0"),
    "sb-norules-equal": ("--method", "sb", "--phase-epochs", "{sb_phases}", "--balance-epochs", "0",
                         "--no-first-task-rules", "--warmup-epochs", "0"),
    "sb-3x": ("--method", "sb", "--balance-epochs", "0", "--first-task-rules", "--warmup-epochs", "0"),
    # the first task alone (c5): head rules and warm-up as the own-data defaults set them, and guards
    "first-rules-warm1": ("--first-task-rules", "--warmup-epochs", "1"),
    "first-norules-warm0": ("--no-first-task-rules", "--warmup-epochs", "0"),
    "first-rules-warm0": ("--first-task-rules", "--warmup-epochs", "0"),
    "first-norules-warm2": ("--no-first-task-rules", "--warmup-epochs", "2"),
}

SEEDS = (0, 1, 2)
# name -> (configurations, variants, seeds): the first variant is the one the others are set against
STUDIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]]] = {
    "heads": (("t20",), ("rules", "norules", "waclip"), SEEDS),
    "pycil": (("t20a",), ("norules", "waclip", "rules"), SEEDS),
    "lr": (("t20", "t20x30"), ("waclip", "waclip-lr1"), SEEDS),
    "warmup": (("t20",), ("waclip", "waclip-warm1"), SEEDS),
    "collapse": (("c5-0", "c5-1", "c5-2"), ("first-rules-warm0", "first-rules-warm1", "first-norules-warm0"),
                 (0, 1, 2, 3, 4)),
    "method": (("t20",), ("waclip", "sb-equal", "sb-3x"), SEEDS),
    "balance": (("t20",), ("waclip", "waclip-bal2", "waclip-bal2-before"), SEEDS),
    "t50": (("t50",), ("rules", "norules", "waclip", "sb-equal"), SEEDS),
    "c10": (("c10",), ("rules", "norules", "waclip", "sb-equal"), SEEDS),
}
ORDER = ("heads", "pycil", "collapse", "warmup", "lr", "method", "balance", "t50", "c10")  # --study all, most important first
DRY_EPOCHS = 1


def sb_phases(epochs: int) -> str:
    """``epochs`` cut into S&B's phases A, B, C (40/30/30 %, each at least 1): a step costs what STD's does."""
    a = max(1, round(epochs * 0.4))
    b = max(1, round(epochs * 0.3))
    return f"{a},{b},{max(1, epochs - a - b)}"


def subset(archive_root: Path, dest: Path, first: int, last: int, per_class: int | None) -> Path:
    """Classes ``first:last`` (folder names sorted) with their first ``per_class`` training files (sorted)
    and all their test files, as hard links, once."""
    if (dest / "READY").is_file():
        return dest
    for split, limit in (("train", per_class), ("test", None)):
        for cls in sorted(p.name for p in (archive_root / split).iterdir() if p.is_dir())[first:last]:
            (dest / split / cls).mkdir(parents=True, exist_ok=True)
            for f in sorted((archive_root / split / cls).iterdir())[:limit]:
                target = dest / split / cls / f.name
                if not target.exists():
                    os.link(f, target)
    (dest / "READY").write_text("ok\n")
    return dest


def folder(name: str, cfg: Config, data: Path, work: Path, dry: bool) -> Path:
    archive = data / cfg.archive if cfg.archive != "cifar10" else next(
        (data / z for z in CIFAR_ZIPS if (data / z).is_file()), data / CIFAR_ZIPS[-1])
    root = unzip(archive, work / "data")
    per_class = None if dry else cfg.per_class
    return subset(root, work / "data" / f"{name}-{cfg.first}-{cfg.last}x{per_class}", cfg.first, cfg.last, per_class)


def job(config: str, variant: str, seed: int, data_dir: Path, runs: Path, dry: bool) -> Job:
    cfg = CONFIGS[config]
    epochs = DRY_EPOCHS if dry else cfg.epochs
    options = [o.replace("{sb_phases}", sb_phases(epochs)) for o in VARIANTS[variant]]
    out = runs / f"{config}-{variant}-s{seed}"
    args = ["train", str(data_dir / "train"), "--test", str(data_dir / "test"), "--pretrained", "none", "--out", str(out), "--json", "--quiet",
            "--device", "auto", "--tasks", str(cfg.tasks), "--epochs", str(epochs), *cfg.options, *options,
            "--seed", str(seed)]
    return Job(out.name, config, args, out, info={"config": config, "variant": variant, "seed": seed,
                                                   "tasks": cfg.tasks})


def plan(studies: list[str], data: Path, work: Path, dry: bool, seeds: tuple[int, ...] | None = None) -> list[Job]:
    """Every run of ``studies`` in order, each (config, variant, seed) once."""
    todo: dict[str, Job] = {}
    for study in studies:
        configs, variants, study_seeds = STUDIES[study]
        for seed in seeds or study_seeds:
            for config in configs:
                for variant in variants:
                    j = job(config, variant, seed, folder(config, CONFIGS[config], data, work, dry), work / "runs", dry)
                    todo.setdefault(j.name, j)
    return list(todo.values())


def finished(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {x["name"] for x in lines if x.get("status") == "ok"}


def adopt(pool: Pool, todo: list[Job]) -> list[Job]:
    """Record the runs whose learner already has every step (a run started by hand, or an earlier
    call stopped before writing its line); return the rest."""
    from sbcli.learner.state import read_state

    rest = []
    for j in todo:
        if j.out is not None and (j.out / "learner.json").is_file():
            try:
                done = len(read_state(j.out).history) >= j.info["tasks"]
            except Exception:  # noqa: BLE001  (a learner being written: run it again)
                done = False
            if done:
                pool.record(j, "ok", 0.0, "")
                continue
        rest.append(j)
    return rest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default="heads", help=f"comma-separated: {', '.join(ORDER)}, or all")
    parser.add_argument("--seeds", default="", help="comma-separated seeds instead of each study's")
    parser.add_argument("--names", default="", help="only the runs whose names match this regular expression")
    parser.add_argument("--data", type=Path, default=None, help="folder of the archives (default: $SBCLI_TEST_DATA, "
                        "the folder the tests read, else .gpu-data)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "sbcli-own-defaults")
    parser.add_argument("--out", type=Path, default=None, help="where results.jsonl goes (default: --work)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of each run")
    parser.add_argument("--budget-s", type=float, default=24 * 3600.0)
    parser.add_argument("--min-start-s", type=float, default=0.0)
    parser.add_argument("--report", action="store_true", help="print the tables from results.jsonl and stop")
    parser.add_argument("--dry", action="store_true", help="tiny generated data, 1 epoch, seed 0: a check")
    args = parser.parse_args()
    out = args.out or args.work
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    studies = list(ORDER) if args.study == "all" else args.study.split(",")
    unknown = [s for s in studies if s not in STUDIES]
    if unknown:
        parser.error(f"unknown study {', '.join(unknown)}; choose from {', '.join(ORDER)} or all")
    if args.report:
        print(report(results, [STUDIES[s] for s in studies]))
        return
    folders = (p for p in (DATA_DIR, REPO / ".gpu-data") if p is not None and p.is_dir())  # DATA_DIR: None when unset
    data = args.data or next(folders, REPO / ".gpu-data")
    if args.dry:
        data = args.work / "dry-data"
        data.mkdir(parents=True, exist_ok=True)
        if not (data / TINY_ZIP).is_file():
            write_tiny_archive(data / TINY_ZIP, classes=100, train=6, test=3)
            write_tiny_archive(data / CIFAR_ZIPS[0], classes=10, train=6, test=3, name="cifar10-jpeg",
                               image_format="JPEG")
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else ((0,) if args.dry else None)
    todo = plan(studies, data, args.work, args.dry, seeds)
    if args.names:
        todo = [j for j in todo if re.search(args.names, j.name)]
    done = finished(results)
    todo = [j for j in todo if j.name not in done]
    (out / "environment.json").write_text(json.dumps({"environment": environment(), "args": {
        k: str(v) for k, v in vars(args).items()}}, indent=2) + "\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SBCLI_THREADS": str(args.threads),
           "OMP_NUM_THREADS": str(args.threads), "XDG_CACHE_HOME": str(args.work / "cache"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    pool = Pool([], args.workers, args.budget_s, args.min_start_s, out, args.work, env)
    pool.todo = adopt(pool, todo)
    print(f"[own-defaults] {len(pool.todo)} runs to go, {len(done) + len(pool.finished)} done", file=sys.stderr,
          flush=True)
    pool.run()
    print(report(results, [STUDIES[s] for s in studies]))


if __name__ == "__main__":
    main()
