"""Nothing lost, nothing half-written: concurrent writers, SIGKILLs at random moments, a crash at every save point.

Three experiments on a tiny learner (synthetic colour classes, 1/8-width ResNet-18, 16 px, one epoch),
each `sb add-task` a real subprocess (`python -m sbcli add-task ...`):

1. ``--trials`` times, two `sb add-task` runs with different new classes start together on a copy
   of the learner. Counted: runs that succeeded, runs refused by the lock, and lost steps (a run
   that exited 0 whose classes are not in the learner afterwards).
2. ``--kills`` times, one `sb add-task` is SIGKILLed: half of them after a random delay, uniform
   over the time one uninterrupted run takes (measured first) plus 10 %, the other half at a random
   moment of the save (0 to 50 ms after the new step's folder appears). Counted: learners that do not load or
   whose kept steps name a missing file ("corrupt or missing"), learners at the old step, at the
   new step, and learners with leftovers (files no kept step names: the kill landed inside the
   save, before its commit or before its clean-up finished). After each kill, the next writer
   (an in-process save under the lock) must leave exactly the files ``learner.json`` names.
3. For every named point of the save (``sbcli.learner.store.commit.checkpoint``), one `sb add-task --keep 1`
   on a learner holding an interrupted save's leftovers (so that the save deletes: leftovers before
   the commit, the dropped step after it) ends at that point (``SBCLI_FAULT_AT``, ``os._exit``) and
   the same checks run.

Example (the figures in docs/learner-format.md):

    python benchmarks/store_crash.py --trials 20 --kills 100
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
COLOURS = {"red": (200, 40, 40), "green": (40, 190, 60), "blue": (40, 60, 200), "yellow": (210, 200, 40),
           "purple": (150, 50, 170), "cyan": (40, 190, 200)}
SMALL = ["--width", "0.125", "--epochs", "1", "--batch-size", "16", "--memory", "8", "--device", "cpu",
         "--image-size", "16"]


def write_classes(root: Path, names: list[str], per_class: int = 24, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            img = np.clip(np.array(COLOURS[name]) + rng.normal(0, 25, (16, 16, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(root / name / f"{i:03d}.png")
    return root


def env(extra: dict | None = None) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(extra or {})}


def sb(*args: str, extra_env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sbcli", *map(str, args)], env=env(extra_env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def add_task(learner: Path, folder: Path, extra_env: dict | None = None, *extra: str) -> subprocess.Popen:
    """``folder/train`` as new classes, ``folder/test`` their test images."""
    return sb("add-task", learner, folder / "train", "--test", folder / "test", "--device", "cpu", "--epochs", "1",
              *extra, extra_env=extra_env)


def check(learner: Path) -> tuple[str, int | None, bool]:
    """(verdict, current step, a save was interrupted): verdict ``ok`` or what is wrong."""
    from sbcli.errors import SbcliError
    from sbcli.learner.state import Learner
    from sbcli.learner.store.layout import read_stored

    try:
        stored = read_stored(learner)
        for step in stored.kept:
            Learner.load(learner, step=step)
    except (SbcliError, OSError) as err:
        return f"corrupt: {err}", None, False
    referenced = stored.referenced() | {"learner.json"}
    on_disk = {p.relative_to(learner).as_posix() for p in learner.rglob("*") if p.is_file()
               and not p.name.startswith(".sbcli.lock")}
    return "ok", stored.current, bool(on_disk - referenced)


def next_writer_cleans(learner: Path) -> bool:
    """The next writer (a save of the current state, under the lock) leaves only what learner.json names."""
    from sbcli.learner.state import Learner
    from sbcli.learner.store.lock import writer_lock

    with writer_lock(learner, "benchmark"):
        current = Learner.load(learner)
        state, name = current.state, f"next-writer-{current.state.steps + 1}"
        state.class_names.append(name)
        state.class_task.append(state.steps)
        state.tasks.append(dataclasses.replace(state.tasks[-1], classes=[name]))
        state.history.append(dataclasses.replace(state.history[-1], step=state.steps + 1, num_classes=len(state.class_names)))
        current.model.expand_classes(1)
        current.save(learner)
    return check(learner)[0] == "ok" and not check(learner)[2]


def concurrent(base: Path, work: Path, new: list[Path], trials: int) -> dict:
    counts = {"trials": trials, "succeeded": 0, "refused_by_lock": 0, "other_failures": 0, "lost_steps": 0}
    for t in range(trials):
        learner = work / f"conc-{t}"
        shutil.copytree(base, learner)
        procs = [add_task(learner, folder) for folder in new]
        outs = [p.communicate() for p in procs]
        classes = set(json.loads((learner / "learner.json").read_text())["class_names"])
        for proc, (_out, err), folder in zip(procs, outs, new, strict=True):
            if proc.returncode == 0:
                counts["succeeded"] += 1
                wanted = {p.name for p in (folder / "train").iterdir()}
                counts["lost_steps"] += not wanted <= classes
            elif "being written by" in " ".join(err.split()):
                counts["refused_by_lock"] += 1
            else:
                counts["other_failures"] += 1
                print(f"trial {t}: unexpected failure: {err.strip()[-300:]}", file=sys.stderr)
        shutil.rmtree(learner)
    return counts


def kills(base: Path, work: Path, folder: Path, n: int, seed: int, workers: int) -> dict:
    """``n`` add-task runs killed at a random moment, ``workers`` at a time (the timing is measured the same way)."""
    timed = [work / f"timing-{w}" for w in range(workers)]
    for learner in timed:
        shutil.copytree(base, learner)
    start = time.perf_counter()
    for proc in [add_task(learner, folder) for learner in timed]:
        proc.communicate()
    duration = time.perf_counter() - start
    for learner in timed:
        shutil.rmtree(learner)
    rng = random.Random(seed)
    delays = [rng.uniform(0, duration * 1.1) if k % 2 == 0 else rng.uniform(0, 0.05) for k in range(n)]
    counts = {"kills": n, "workers": workers, "seconds_per_run": round(duration, 1), "corrupt_or_missing": 0,
              "old_step": 0, "new_step": 0, "leftovers_found": 0, "next_writer_failed": 0}
    lock = threading.Lock()

    def one(k: int) -> None:
        learner = work / f"kill-{k}"
        shutil.copytree(base, learner)
        proc = add_task(learner, folder)
        if k % 2 == 1:  # a random moment of the save: within 50 ms of the new step's folder appearing
            while not (learner / "steps" / "0002").exists() and proc.poll() is None:
                time.sleep(0.002)
        time.sleep(delays[k])  # k even: a random moment of the whole run
        proc.kill()
        proc.communicate()
        with lock:
            tally(counts, learner, base_steps=1)
        shutil.rmtree(learner)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(n)))
    return counts


def tally(counts: dict, learner: Path, base_steps: int) -> None:
    verdict, step, interrupted = check(learner)
    if verdict != "ok":
        counts["corrupt_or_missing"] += 1
        print(f"{learner.name}: {verdict}", file=sys.stderr)
        return
    counts["old_step" if step == base_steps else "new_step"] += 1
    counts["leftovers_found"] += interrupted
    counts["next_writer_failed"] += not next_writer_cleans(learner)


def plant_leftovers(learner: Path) -> None:
    """What a save killed before its commit leaves: a step folder nobody names and a temporary."""
    (learner / "steps" / "0007").mkdir()
    (learner / "steps" / "0007" / "model.safetensors").write_bytes(b"half")
    (learner / "learner.json.tmp-4242").write_text("{half")


def fault_points(base: Path, work: Path, folder: Path) -> dict:
    """Run one add-task to list the save's points, then end one add-task at each of them."""
    learner = work / "points"
    shutil.copytree(base, learner)
    plant_leftovers(learner)
    probe = ("import sys; from sbcli.learner.store import commit; seen = []; commit.checkpoint = seen.append; "
             "from sbcli import api; api.add_task(sys.argv[1], sys.argv[2], sys.argv[3], device='cpu', "
             "options=api.AddTaskOptions(epochs=1), keep=1); "
             "print(repr(seen))")
    done = subprocess.run([sys.executable, "-c", probe, str(learner), str(folder / "train"), str(folder / "test")],
                          env=env(), capture_output=True,
                          text=True, check=True)
    points = sorted(set(ast.literal_eval(done.stdout.strip().splitlines()[-1])))
    shutil.rmtree(learner)
    counts = {"points": points, "corrupt_or_missing": 0, "old_step": 0, "new_step": 0, "leftovers_found": 0,
              "next_writer_failed": 0, "not_reached": 0}
    for point in points:
        learner = work / f"point-{point.replace(':', '-')}"
        shutil.copytree(base, learner)
        plant_leftovers(learner)
        proc = add_task(learner, folder, {"SBCLI_FAULT_AT": point}, "--keep", "1")
        proc.communicate()
        counts["not_reached"] += proc.returncode != 86
        tally(counts, learner, base_steps=1)
        shutil.rmtree(learner)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="pairs of concurrent add-task runs")
    parser.add_argument("--kills", type=int, default=100, help="add-task runs SIGKILLed at a random moment")
    parser.add_argument("--workers", type=int, default=1, help="killed runs at a time")
    parser.add_argument("--no-points", action="store_true", help="skip the crash at every save point")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory(prefix="sbcli-store-crash-") as tmp:
        work = Path(tmp)
        data = {}
        for seed, (name, classes) in enumerate((("base", ["red", "green"]), ("a", ["blue", "yellow"]),
                                                ("b", ["purple", "cyan"]))):
            data[name] = work / "data" / name
            write_classes(data[name] / "train", classes, 24, seed)
            write_classes(data[name] / "test", classes, 8, seed + 10)
        base = work / "base"
        done = sb("train", data["base"] / "train", "--test", data["base"] / "test", "--out", base, "--method", "std", *SMALL)
        _, err = done.communicate()
        if done.returncode != 0:
            raise SystemExit(err)
        results = {} if args.no_points else {"fault_points": fault_points(base, work, data["a"])}
        print(json.dumps(results), file=sys.stderr, flush=True)
        results["concurrent"] = concurrent(base, work, [data["a"], data["b"]], args.trials)
        print(json.dumps(results["concurrent"]), file=sys.stderr, flush=True)
        results["sigkill"] = kills(base, work, data["a"], args.kills, args.seed, args.workers)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
