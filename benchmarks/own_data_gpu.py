"""The own-data measurements in one command: many small `sb` runs side by side on one GPU.

    bash benchmarks/own_data_gpu.sh --data DIR            # on a machine with a GPU (docs/lab/benchmarks.md)
    PYTHONPATH=. python benchmarks/own_data_gpu.py --dry   # the same flow, tiny, on the CPU

The data are read from ``--data`` (default ``.gpu-data/`` in the checkout): the 32 px Tiny-ImageNet-100 archive and
CIFAR-10 at 500 images a class (``gpu_data.write_subset``). The runs are benchmarks/own_data_jobs.py's, started most important
first, ``--workers`` at a time; a local Hub server (tests/fake_hub.py) takes the pretrained
backbone's push and serves it to ``--pretrained``. Every run runs in full unless ``--budget-s`` gives them
all a time limit: then no run starts when less than ``--min-start-s`` of it is left, and the ones still
running at its end are stopped, so the command ends inside it with what finished. Every finished run adds a line to ``results.jsonl`` under ``--out``
(each step's accuracy, old, new, seconds, phases and records, read back from the learner).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests")]
from gpu_data import unzip  # noqa: E402
from gpu_env import environment  # noqa: E402
from own_data_jobs import DRY, Folders, Job, Sizes, jobs  # noqa: E402

TINY_ZIP, CIFAR_ZIP = "tiny-imagenet-100-32px.zip", "cifar10-500.zip"


def subset(src: Path, dest: Path, classes: int, per_class: int | None) -> Path:
    """The first ``classes`` class folders (sorted), the first ``per_class`` training files of each
    (sorted) and all their test files, as hard links."""
    if (dest / "READY").is_file():
        return dest
    for split, limit in (("train", per_class), ("test", None)):
        for cls in sorted(p.name for p in (src / split).iterdir() if p.is_dir())[:classes]:
            (dest / split / cls).mkdir(parents=True, exist_ok=True)
            for f in sorted((src / split / cls).iterdir())[:limit]:
                os.link(f, dest / split / cls / f.name)
    (dest / "READY").write_text("ok\n")
    return dest


def prepare(data: Path, work: Path) -> Folders:
    tiny = unzip(data / TINY_ZIP, work / "data")
    cifar = unzip(data / CIFAR_ZIP, work / "data")
    return Folders(retain=subset(tiny, work / "data" / "retain-50x250", 50, 250),
                   warmup=subset(tiny, work / "data" / "warmup-20x250", 20, 250), tiny=tiny, cifar=cifar)


def learner_results(path: Path) -> dict:
    """Per step: accuracy, old, new (and intra), seconds, phases, the WA factor and the records' accuracies."""
    from sbcli.learner.state import read_state

    state = read_state(path)
    steps = []
    for h in state.history:
        m, rec = h.metrics, h.record
        steps.append({"classes": h.num_classes, "overall": m.overall, "old": m.old, "new": m.new,
                      "intra_old": m.intra_old, "intra_new": m.intra_new, "seconds": h.seconds,
                      "phases": [{k: p.get(k) for k in ("name", "epochs", "final_loss", "seconds", "images_per_s",
                                                        "precision", "best_epoch")} for p in h.phases],
                      "wa_factor": rec.get("wa_factor"),
                      **{k: {kk: rec[k].get(kk) for kk in ("overall", "old", "new")}
                         for k in ("before_wa", "before_balance", "after_B", "after_C") if isinstance(rec.get(k), dict)}})
    return {"steps": steps, "train_config": dataclasses.asdict(state.train_config), "method": state.method,
            "pretrained": state.provenance.pretrained}


@dataclass
class Running:
    job: Job
    proc: subprocess.Popen
    start: float
    log: Path


class Pool:
    """Starts jobs in order as workers free up, respecting ``after`` and the budget."""

    def __init__(self, todo: list[Job], workers: int, budget_s: float | None, min_start_s: float, out: Path,
                 work: Path, env: dict[str, str]) -> None:
        self.todo, self.workers, self.out, self.work, self.env = list(todo), workers, out, work, env
        self.deadline = math.inf if budget_s is None else time.monotonic() + budget_s  # None: no budget
        self.min_start_s = min_start_s
        self.running: list[Running] = []
        self.status: dict[str, str] = {}
        self.finished: list[dict] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def ready(self, job: Job) -> bool | None:
        """True: may start; False: wait; None: never (its dependency failed or was skipped)."""
        if job.after is None:
            return True
        dep = self.status.get(job.after)
        return True if dep == "ok" else (None if dep in ("failed", "skipped", "killed") else False)

    def start_more(self) -> None:
        for job in list(self.todo):
            if len(self.running) >= self.workers:
                return
            ok = self.ready(job)
            if ok is None or self.left() < self.min_start_s:
                self.todo.remove(job)
                self.record(job, "skipped", 0.0, "dependency failed" if ok is None else "budget left too small")
            elif ok:
                self.todo.remove(job)
                log = self.work / "logs" / f"{job.name}.log"
                log.parent.mkdir(parents=True, exist_ok=True)
                cmd = [sys.executable, *(job.args if job.args[0] in ("-m", "-c") else ["-m", "sbcli", *job.args])]
                handle = log.open("w")
                proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=handle, stderr=subprocess.STDOUT)
                handle.close()
                self.running.append(Running(job, proc, time.monotonic(), log))
                print(f"[own-data] start {job.name} ({self.left():.0f} s left)", file=sys.stderr, flush=True)

    def reap(self, kill: bool = False) -> None:
        for r in list(self.running):
            code = r.proc.poll()
            if code is None and not kill:
                continue
            if code is None:
                r.proc.kill()
                r.proc.wait()
            self.running.remove(r)
            seconds = time.monotonic() - r.start
            tail = r.log.read_text(errors="replace")[-1500:]
            status = "killed" if code is None else ("ok" if code == 0 else "failed")
            self.record(r.job, status, seconds, tail if status != "ok" else "")

    def record(self, job: Job, status: str, seconds: float, why: str) -> None:
        self.status[job.name] = status
        line = {"name": job.name, "group": job.group, **job.info, "status": status, "seconds": round(seconds, 1),
                "command": "python " + " ".join(job.args) if job.args[0] in ("-m", "-c") else "sb " + " ".join(job.args)}
        if why:
            line["why"] = why
        if status in ("ok", "killed") and job.out is not None and (job.out / "learner.json").is_file():
            try:
                line |= learner_results(job.out)
            except Exception as err:  # noqa: BLE001  (one unreadable learner must not stop the others)
                line["read_error"] = f"{type(err).__name__}: {err}"
        self.finished.append(line)
        with (self.out / "results.jsonl").open("a") as fh:
            fh.write(json.dumps(line, default=str) + "\n")
        last = line.get("steps", [{}])[-1] if line.get("steps") else {}
        print(f"[own-data] {status} {job.name} {seconds:.0f} s"
              + (f" last {last.get('overall', 0):.1f} (old {last.get('old') or 0:.1f} new {last.get('new') or 0:.1f})"
                 if last else ""), file=sys.stderr, flush=True)

    def failing_early(self) -> bool:
        """The first four finished runs all failed: something is broken everywhere; stop."""
        done = [f for f in self.finished if f["status"] in ("ok", "failed")]
        return len(done) >= 4 and all(f["status"] == "failed" for f in done[:4])

    def run(self) -> None:
        while self.todo or self.running:
            self.reap()
            if self.failing_early():
                print("[own-data] the first four runs failed: stopping", file=sys.stderr, flush=True)
                self.todo.clear()
                self.reap(kill=True)
                return
            if self.left() <= 0:
                self.reap(kill=True)
                for job in self.todo:
                    self.record(job, "skipped", 0.0, "budget spent")
                self.todo.clear()
                return
            self.start_more()
            time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO / ".gpu-data",
                        help=f"the folder holding {TINY_ZIP} and {CIFAR_ZIP}")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "own-data-gpu")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "sbcli-own-data")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="time budget of all the runs together, seconds (default: none, every run in full)")
    parser.add_argument("--min-start-s", type=float, default=40.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each run")
    parser.add_argument("--only", default="", help="comma-separated groups (retain, warmup, val, pretrain, push, cifar, tests)")
    parser.add_argument("--names", default="", help="only the runs whose names match this regular expression")
    parser.add_argument("--pretrain", default="30,256,0.1", help="the backbone's epochs,batch size,lr")
    parser.add_argument("--gpu-tests", action="store_true", help="also run pytest -m gpu as the last job")
    parser.add_argument("--dry", action="store_true", help="tiny data and budgets, for a check on the CPU")
    args = parser.parse_args()

    from fake_hub import FakeHub

    args.out.mkdir(parents=True, exist_ok=True)
    if args.dry:
        shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True, exist_ok=True)
    info = {"environment": environment(), "args": {k: str(v) for k, v in vars(args).items()}}
    (args.out / "environment.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"[own-data] {info['environment']}", file=sys.stderr, flush=True)
    if args.dry:  # generated archives of the same layouts, in the work folder
        from gpu_data import write_tiny_archive

        args.data = args.work / "dry-data"
        args.data.mkdir()
        write_tiny_archive(args.data / TINY_ZIP, classes=12, train=10, test=4)
        write_tiny_archive(args.data / CIFAR_ZIP, classes=10, train=10, test=4, name="cifar10-jpeg", image_format="JPEG")
    folders = prepare(args.data, args.work)
    runs = args.work / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    epochs, batch, lr = args.pretrain.split(",")
    sizes = DRY if args.dry else Sizes(pretrain_epochs=int(epochs), pretrain_batch=int(batch), pretrain_lr=float(lr))
    todo = jobs(folders, runs, sizes)
    if args.gpu_tests:
        todo.append(Job("gpu-tests", "tests", ["-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", "--continue-on-collection-errors", "tests"]))
    if args.only:
        keep = set(args.only.split(","))
        todo = [j for j in todo if j.group in keep]
    if args.names:
        todo = [j for j in todo if re.search(args.names, j.name)]
    with FakeHub() as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(args.work / "hf_home"),
               "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "PYTHONUNBUFFERED": "1",
               "SBCLI_THREADS": str(args.threads), "OMP_NUM_THREADS": str(args.threads),
               "XDG_CACHE_HOME": str(args.work / "cache"),
               "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
        for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
            env.pop(var, None)
        pool = Pool(todo, args.workers, args.budget_s, args.min_start_s, args.out, args.work, env)
        pool.run()
    counts = {s: sum(1 for f in pool.finished if f["status"] == s) for s in ("ok", "failed", "killed", "skipped")}
    print(f"[own-data] done: {counts}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
