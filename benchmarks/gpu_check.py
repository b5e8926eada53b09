"""One command for a machine with a GPU: environment, ``pytest -m gpu``, the engine benchmark, a profile, a real run.

Run it through ``benchmarks/gpu_check.sh`` (which keeps a log, and with ``--install`` first installs
the checkout from the package index); docs/lab/performance.md ("On a GPU") gives the command. Steps, each recorded in
``results.json`` and ``results.md`` under ``--out`` as soon as it ends (a run stopped at its time
limit keeps what it finished):

1. ``env``: Python, torch, CUDA, the GPU, cuDNN and NCCL versions; the packages sbcli needs
   (imported, with versions; WebP decoding for the data) and ``python -m sbcli --help``.
2. ``tests``: ``pytest -m gpu`` (every CUDA path; tests/test_gpu.py), counts, failures, skip reasons.
3. ``bench``, ``bench512``: benchmarks/engine_speed.py at 32 px, ResNet-18 width 1.0, batch 256 and 512,
   bf16: the engine with a teacher (an incremental step) and without (a first step), and the reference
   loop, side by side, against the targets (>= 60,000 img/s with a teacher, >= 80,000 without, >= 10x
   the reference).
4. ``profile`` (when the engine misses its target, or ``--profile yes``): torch.profiler over one
   epoch of a teacher-guided phase: the top operators by device time and how busy the GPU was.
5. ``ddp``: ``torchrun --nproc-per-node N -m sbcli train`` over every GPU there (NCCL; N = 1 is still
   a real process group), then ``sb add-task`` of the same learner in one process
   (benchmarks/gpu_ddp.py).
6. ``sequence``: the real 10-task run on the 32 px Tiny-ImageNet-100 (benchmarks/paper_compare.py):
   ``compare`` (default) trains S&B + WA, STD + WA and, if it fits, the equal-compute control, with
   the epochs that fit the time left; ``sb`` trains S&B + WA alone; ``none`` skips it.

``--dry`` runs the same steps at tiny sizes on whatever device there is (the CPU without a GPU), on a
generated archive of the same layout: tests/benchmarks/test_gpu_check.py runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import tempfile
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
from gpu_check_report import TARGET_IMG_S, TARGET_NO_TEACHER_IMG_S, TARGET_X_REF, markdown  # noqa: E402
from gpu_data import copy_size  # noqa: E402
from gpu_env import environment  # noqa: E402


@dataclass
class CheckConfig:
    out: Path
    data: Path | None  # the 32 px Tiny-ImageNet-100 archive (ddp, sequence); None: those steps are skipped
    work: Path
    budget_s: float | None = None  # the whole check, seconds; None: no limit, every step runs in full
    dry: bool = False
    skip: tuple[str, ...] = ()
    bench_seconds: float = 3.0
    bench_rounds: int = 2
    bench_compile: bool = False  # also the benchmark with --compile (compiling costs a minute or two)
    profile: str = "auto"  # auto: when the engine misses its target on CUDA; yes; no
    sequence: str = "compare"  # compare, sb, none
    sequence_epochs: int | None = None  # per phase; None: fit the time left
    control: str = "auto"
    seed: int = 0  # the comparison's initialisation and sampling seed (the class order stays seed 0)


@dataclass
class Check:
    """The results so far, rewritten to disk after every step."""

    cfg: CheckConfig
    start: float = field(default_factory=time.monotonic)
    results: dict = field(default_factory=dict)

    def left(self) -> float:
        """Seconds left of the budget (infinite without one)."""
        if self.cfg.budget_s is None:
            return math.inf
        return self.cfg.budget_s - (time.monotonic() - self.start)

    def record(self, step: str, value: dict) -> None:
        self.results[step] = value
        self.results["elapsed_s"] = round(time.monotonic() - self.start, 1)
        self.cfg.out.mkdir(parents=True, exist_ok=True)
        (self.cfg.out / "results.json").write_text(json.dumps(self.results, indent=2, default=str) + "\n")
        try:
            text = markdown(self.results)
        except Exception as err:  # noqa: BLE001  (the JSON must still be written and the run go on)
            text = f"# sbcli GPU check\n\nresults.md failed to render ({type(err).__name__}: {err}); read results.json.\n"
        (self.cfg.out / "results.md").write_text(text)
        print(f"[gpu_check] {step} done at {self.results['elapsed_s']} s", file=sys.stderr, flush=True)


def run_logged(cmd: list[str], timeout: float) -> tuple[int, str, float]:
    """Run ``cmd`` with its output streamed to ours (the log) and kept; (exit code, output, seconds).

    Killed after ``timeout`` seconds (exit code 124), silent or not.
    """
    start = time.monotonic()
    print("[gpu_check] $ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            print(line, end="", file=sys.stderr, flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
        code = 124
        lines.append(f"[gpu_check] killed after {timeout:.0f} s\n")
    reader.join(timeout=10)
    return code, "".join(lines), time.monotonic() - start


# ---------------------------------------------------------------------------------------------
# 1. Environment
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# 2. pytest -m gpu
# ---------------------------------------------------------------------------------------------


def gpu_tests(check: Check) -> dict:
    junit = check.cfg.work / "junit.xml"
    target = "tests/test_gpu.py" if check.cfg.dry else "tests"
    # a test module that cannot be imported there (a package version) must not stop the GPU tests
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", "--continue-on-collection-errors",
           f"--junitxml={junit}", target]
    code, output, seconds = run_logged(cmd, timeout=min(300.0, max(30.0, check.left() - 240)))
    summary = {"command": "python -m pytest -m gpu -q -rs " + target, "exit_code": code, "seconds": round(seconds, 1),
               "tail": output[-2000:]}
    if junit.is_file():
        summary |= junit_summary(junit)
    return summary


def junit_summary(path: Path) -> dict:
    """Counts, failures (name and message) and skip reasons from a JUnit XML report."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    failed, skipped = [], {}
    for case in suite.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        for tag in ("failure", "error"):
            node = case.find(tag)
            if node is not None:
                failed.append({"test": name, "message": (node.get("message") or "")[:400]})
        node = case.find("skipped")
        if node is not None:
            reason = (node.get("message") or "").removeprefix("Skipped: ")
            skipped[reason] = skipped.get(reason, 0) + 1
    return {"counts": counts, "failed": failed, "skip_reasons": skipped}


# ---------------------------------------------------------------------------------------------
# 3. The engine benchmark, 4. the profile
# ---------------------------------------------------------------------------------------------


def step_flops(width: float, image_size: int, classes: int) -> dict:
    """Floating-point operations per image of a training step (torch's FLOP counter, on the CPU).

    With a teacher: the student's forward and backward plus the teacher's forward; without: the
    student's alone. Over a rate, they give the arithmetic the GPU sustained (TFLOP/s), to hold
    against the bf16 matrix rate the device docs measured (about 790 TFLOP/s on an H100 or H200).
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from sbcli.nets import create_model

    model = create_model("resnet18", classes, width)
    x = torch.randn(2, 3, image_size, image_size)
    with FlopCounterMode(display=False) as forward:
        model(x)
    with FlopCounterMode(display=False) as both:
        model(x).sum().backward()
    fwd, fwd_bwd = forward.get_total_flops() / 2, both.get_total_flops() / 2
    return {"forward_gflop": fwd / 1e9, "no_teacher_gflop": fwd_bwd / 1e9, "with_teacher_gflop": (fwd_bwd + fwd) / 1e9}


def bench_args(cfg: CheckConfig, out: Path, batch: int = 256) -> list[str]:
    if cfg.dry:
        size = ["--width", "0.125", "--batch-size", str(batch // 16), "--image-size", "16", "--classes", "4",
                "--images", "64", "--seconds", "0.3", "--rounds", "1", "--threads", "1"]
    else:
        size = ["--device", "cuda", "--width", "1.0", "--batch-size", str(batch), "--image-size", "32", "--classes",
                "100", "--images", str(max(10000, 40 * batch)), "--seconds", str(cfg.bench_seconds), "--rounds",
                str(cfg.bench_rounds)]
    return [sys.executable, "benchmarks/engine_speed.py", *size, "--data", "random", "--precision", "auto",
            "--without-teacher", "--eager", "--json", str(out)]


def engine_bench(check: Check, compiled: bool = False, batch: int = 256) -> dict:
    """The benchmark's rows against the targets at ``batch``; ``compiled``: with ``--compile`` (one round)."""
    out = check.cfg.work / f"engine_speed{'_compile' if compiled else ''}_b{batch}.json"
    cmd = bench_args(check.cfg, out, batch) + (["--compile", "--rounds", "1"] if compiled else [])
    code, output, seconds = run_logged(cmd, timeout=min(300.0, max(30.0, check.left() - 150)))
    result = {"command": " ".join(cmd[1:]), "exit_code": code, "seconds": round(seconds, 1)}
    if code != 0 or not out.is_file():
        return result | {"tail": output[-2000:]}
    report = json.loads(out.read_text())
    ref = report["reference"]["img_s"]
    c = report["config"]
    flops = step_flops(c["width"], c["image_size"], c["classes"])
    per_image = lambda name: flops["no_teacher_gflop" if "no teacher" in name else "with_teacher_gflop"]  # noqa: E731
    rows = [{"name": r["name"], "img_s": r["img_s"], "x_reference": r["img_s"] / ref} for r in report["engines"]]
    rows.append({"name": "reference", "img_s": ref, "x_reference": 1.0})
    for row in rows:
        row["tflop_s"] = row["img_s"] * per_image(row["name"]) / 1e3
    teacher = next(r for r in rows if "no teacher" not in r["name"] and r["name"] != "reference")
    first = next((r for r in rows if "no teacher" in r["name"]), None)
    without = first["img_s"] if first else None
    ten = next(s for s in report["schedules"] if s["tasks"] == 10)
    meets = (teacher["img_s"] >= TARGET_IMG_S and teacher["x_reference"] >= TARGET_X_REF
             and (without is None or without >= TARGET_NO_TEACHER_IMG_S))
    return result | {"hardware": report["hardware"], "torch": report["torch"], "rows": rows, "batch_size": batch,
                     "with_teacher_img_s": teacher["img_s"], "without_teacher_img_s": without,
                     "target_img_s": TARGET_IMG_S, "target_no_teacher_img_s": TARGET_NO_TEACHER_IMG_S,
                     "meets_target": meets,
                     "paper_cifar100_10_tasks_hours": ten["hours"], "batches_per_round": report["batches_per_round"],
                     "flops_per_image": flops}


def profile(check: Check) -> dict:
    """torch.profiler over one epoch of phase C (student + teacher) at the benchmark's size."""
    import torch
    from torch.profiler import ProfilerActivity

    from sbcli.data.device import DeviceData, Normalization
    from sbcli.engine.loop import Engine, Phase, TrainConfig
    from sbcli.methods.teachers import frozen_copy
    from sbcli.methods.split_bridge import bridge_loss
    from sbcli.nets import create_model

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    width, batch, size, batches = (0.125, 16, 16, 3) if check.cfg.dry else (1.0, 256, 32, 20)
    torch.manual_seed(0)
    model = create_model("resnet18", 100, width).to(device)
    teacher = frozen_copy(model)
    images = torch.randint(0, 256, (batch * batches, 3, size, size), dtype=torch.uint8, device=device)
    data = DeviceData(images, torch.randint(0, 100, (batch * batches,), device=device))
    engine = Engine(TrainConfig(epochs=1, batch_size=batch), device, Normalization(), seed=0)
    phase = Phase("C", bridge_loss(50, 0.5), 1, teacher=teacher)
    engine.run(model, data, phase)  # warm-up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        report = engine.run(model, data, phase)
        wall = time.perf_counter() - start
    events = prof.key_averages()
    key = "device_time_total" if cuda else "cpu_time_total"
    self_key = "self_device_time_total" if cuda else "self_cpu_time_total"
    busy = gpu_busy_s(prof) if cuda else None
    top = sorted(events, key=lambda e: getattr(e, key, 0.0), reverse=True)[:15]
    return {"batches": batches, "batch_size": batch, "wall_s": round(wall, 4), "images_per_s": report.images_per_s,
            "sort": key, "gpu_busy_fraction": None if busy is None else round(busy / wall, 3),  # ~1: GPU-bound; low: launch-bound
            "top": [{"op": e.key, "total_ms": round(getattr(e, key, 0.0) / 1e3, 3),
                     "self_ms": round(getattr(e, self_key, 0.0) / 1e3, 3), "calls": e.count} for e in top],
            "table": events.table(sort_by=self_key, row_limit=25)}


def gpu_busy_s(prof) -> float | None:
    """Seconds the GPU spent in kernels (one stream: they do not overlap); less than the wall time
    by the time the GPU waited for the host to launch work."""
    from torch.autograd import DeviceType

    kernels = [e for e in prof.events() if getattr(e, "device_type", None) == DeviceType.CUDA]
    return sum(e.time_range.elapsed_us() for e in kernels) / 1e6 if kernels else None


# ---------------------------------------------------------------------------------------------
# 5. The real sequence
# ---------------------------------------------------------------------------------------------


def data_folders(cfg: CheckConfig) -> tuple[Path, Path] | dict:
    """The archive's train and test folders, unpacked once (a generated tiny archive when dry), or why not."""
    from gpu_data import DATA_NAME, unpack, write_tiny_archive

    archive = write_tiny_archive(cfg.work / "tiny.zip") if cfg.dry else cfg.data
    if archive is None:
        return {"skipped": f"no --data given (the path of {DATA_NAME}.zip)"}
    if not archive.is_file():
        return {"skipped": f"{archive} is missing (--data names {DATA_NAME}.zip)"}
    return unpack(archive, cfg.work / "data")


def ddp(check: Check) -> dict:
    """torchrun over every GPU (NCCL), then one process goes on (benchmarks/gpu_ddp.py); gloo on the CPU when dry."""
    import torch
    from gpu_ddp import ddp_check

    cfg = check.cfg
    folders = data_folders(cfg)
    if isinstance(folders, dict):
        return folders
    train, test = folders
    cuda = torch.cuda.is_available() and not cfg.dry
    nproc, device = (torch.cuda.device_count(), "cuda") if cuda else (1, "cpu")
    return ddp_check(run_logged, cfg.work, train, test, nproc, device, timeout=min(240.0, max(60.0, check.left() - 60)))


def sequence(check: Check) -> dict:
    import paper_compare as pc

    cfg = check.cfg
    folders = data_folders(cfg)
    if isinstance(folders, dict):
        return folders
    train, test = folders
    budget = check.left() - 20
    if budget < (30 if cfg.dry else 120):
        return {"skipped": f"only {budget:.0f} s left of the check's budget"}
    main_rows = ("sb-wa",) if cfg.sequence == "sb" else ("sb-wa", "std-wa")
    compare = pc.CompareConfig(train=train, test=test, out=cfg.out, budget_s=None if math.isinf(budget) else budget,
                               epochs=cfg.sequence_epochs,
                               control="no" if cfg.sequence == "sb" else cfg.control, main_rows=main_rows,
                               seed=cfg.seed)
    if cfg.dry:
        compare = pc.dry_config(compare)
    # no compare.json/.md of its own: the report goes into results.json/.md, beside the other steps'
    return pc.run_compare(compare, cfg.work / "runs", prefix=None, on_report=lambda rep: check.record("sequence", rep))


STEPS = ("env", "tests", "bench", "bench512", "compile", "profile", "ddp", "sequence")


def run(cfg: CheckConfig) -> dict:
    check = Check(cfg)
    cfg.work.mkdir(parents=True, exist_ok=True)
    check.results["config"] = {k: str(v) for k, v in dataclasses.asdict(cfg).items()}
    actions = {"env": environment, "tests": lambda: gpu_tests(check), "bench": lambda: engine_bench(check),
               "bench512": lambda: engine_bench(check, batch=512),
               "compile": lambda: engine_bench(check, compiled=True), "profile": lambda: profile(check),
               "ddp": lambda: ddp(check),
               "sequence": lambda: sequence(check)}
    for step in STEPS:
        off = (step == "sequence" and cfg.sequence == "none") or (step == "compile" and not cfg.bench_compile)
        if step in cfg.skip or off or not wants_profile(check, step):
            continue
        try:
            check.record(step, actions[step]())
        except Exception as err:  # noqa: BLE001  (one failed step must not lose the others' results)
            check.results.setdefault("errors", {})[step] = f"{type(err).__name__}: {err}"
            check.record(step, {"error": f"{type(err).__name__}: {err}"})
    return check.results


def wants_profile(check: Check, step: str) -> bool:
    if step != "profile" or check.cfg.profile == "yes":
        return True
    if check.cfg.profile == "no":
        return False
    bench = check.results.get("bench", {})
    cuda = check.results.get("env", {}).get("cuda_available", False)
    return (cuda or check.cfg.dry) and not bench.get("meets_target", False)


def parse(argv: list[str] | None = None) -> CheckConfig:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "results" / "gpu-check")
    p.add_argument("--data", type=Path, default=None,
                   help="the 32 px Tiny-ImageNet-100 archive (steps ddp and sequence; skipped without it)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "sbcli-gpu-check")
    p.add_argument("--budget-s", type=float, default=None,
                   help="time budget of the whole check, seconds: a step that no longer fits is skipped, and the "
                        "comparison's epochs are the most that fit (default: no budget; --sequence-epochs or 30)")
    p.add_argument("--dry", action="store_true", help="tiny sizes, any device (the CPU without a GPU)")
    p.add_argument("--skip", default="", help=f"comma-separated steps to leave out: {','.join(STEPS)}")
    p.add_argument("--bench-seconds", type=float, default=3.0)
    p.add_argument("--bench-rounds", type=int, default=2)
    p.add_argument("--bench-compile", action="store_true", help="also the benchmark with --compile (one round)")
    p.add_argument("--profile", choices=("auto", "yes", "no"), default="auto")
    p.add_argument("--sequence", choices=("compare", "sb", "none"), default="compare")
    p.add_argument("--sequence-epochs", type=int, default=None, help="epochs a phase (default: fit the time left)")
    p.add_argument("--control", choices=("auto", "yes", "no"), default="auto")
    p.add_argument("--seed", type=int, default=0,
                   help="the comparison's seed (initialisation, batches; the class order stays seed 0's)")
    p.add_argument("--flops", action="store_true",
                   help="print the FLOPs per image of the benchmark's training steps (CPU, a second) and exit")
    p.add_argument("--copy-size", action="store_true",
                   help="before copying the checkout to the GPU machine: print what the copy weighs (MiB, with the "
                        "ignored folders .gpu-data/ and .whl/ if they are there) and exit")
    p.add_argument("--max-copy-mb", type=float, default=None,
                   help="with --copy-size: exit 1 when the copy weighs more than this many MiB (default: no limit)")
    a = p.parse_args(argv)
    skip = tuple(s for s in a.skip.split(",") if s)
    unknown = set(skip) - set(STEPS)
    if unknown:
        p.error(f"--skip: unknown steps {', '.join(sorted(unknown))}")
    return CheckConfig(out=a.out, data=a.data, work=a.work, budget_s=a.budget_s, dry=a.dry, skip=skip,
                       bench_seconds=a.bench_seconds, bench_rounds=a.bench_rounds, bench_compile=a.bench_compile,
                       profile=a.profile,
                       sequence=a.sequence, sequence_epochs=a.sequence_epochs, control=a.control, seed=a.seed)


def copy_limit(argv: list[str]) -> float | None:
    """``--max-copy-mb`` of ``argv`` (None: no limit)."""
    p = argparse.ArgumentParser()
    p.add_argument("--max-copy-mb", type=float, default=None)
    return p.parse_known_args(argv)[0].max_copy_mb


def main(argv: list[str] | None = None) -> None:
    if "--flops" in (sys.argv[1:] if argv is None else argv):
        print(json.dumps(step_flops(1.0, 32, 100)))  # the benchmark's network: ResNet-18, 32 px, 100 classes
        return
    if "--copy-size" in (sys.argv[1:] if argv is None else argv):
        limit = copy_limit(sys.argv[1:] if argv is None else argv)
        size = copy_size(REPO, [".gpu-data", ".whl"], limit)  # before copying the checkout to another machine
        print(json.dumps(size))
        sys.exit(0 if size["fits"] else 1)
    cfg = parse(argv)
    if cfg.dry:
        import torch

        torch.set_num_threads(1)
    results = run(cfg)
    print(markdown(results))


if __name__ == "__main__":
    main()
