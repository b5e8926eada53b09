"""Where and in what precision work runs: device names, bf16 rules, cuDNN autotuning, CPU threads.

Below the engine and the export layer, so that both (and the Python face) use the same rules
without importing each other.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from sbcli.engine import distributed
from sbcli.errors import ConfigError, DeviceError


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present. Raises DeviceError when CUDA is asked for and absent.

    Under torchrun this joins the process group and gives this rank's device (see sbcli.engine.distributed).
    """
    if name == "auto":
        return distributed.join(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError("--device cuda was asked for but this machine has no CUDA GPU; use --device cpu or auto.")
    if name != "cpu" and not name.startswith("cuda"):
        raise DeviceError(f"--device {name} is unknown; use auto, cpu or cuda.")
    return distributed.join(torch.device(name))


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 natively, so that bf16 autocast is faster than float32.

    A CUDA GPU with bf16 units (Ampere or later), or a CPU with AVX-512 BF16 or AMX tiles (oneDNN's
    bf16 convolutions; measured 1.7x to 2.0x the float32 step on a 2-core AMD EPYC CPU, docs/lab/performance.md).
    Elsewhere bf16 would be emulated, slower than float32.
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return any(getattr(torch.cpu, probe, lambda: False)()
                   for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return False


def uses_bf16(precision: str, device: torch.device) -> bool:
    """Whether steps run under bf16 autocast: ``auto`` means where the device has native bf16."""
    return PRECISIONS[precision](device)


PRECISIONS: dict[str, Callable[[torch.device], bool]] = {
    "auto": native_bf16,
    "bf16": lambda device: True,
    "fp32": lambda device: False,
}


@contextmanager
def cudnn_autotune(device: torch.device) -> Iterator[None]:
    """Let cuDNN pick its fastest kernels (batch shapes are fixed) while training on CUDA, then restore.

    Only for the block it wraps: the process's setting is left as it was, so that a notebook or
    a caller's own code keeps the determinism it chose.
    """
    if device.type != "cuda":
        yield
        return
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


@contextmanager
def exact_float32(device: torch.device) -> Iterator[None]:
    """On CUDA, float32 convolutions and matrix products in full float32 rather than TF32.

    cuDNN computes float32 convolutions in TF32 by default (10-bit mantissa): then a CUDA
    evaluation would differ from the CPU's and the ONNX model's by about 1e-3 and could flip an
    argmax. Scoring is a small part of a run, so it is done in full precision. No-op elsewhere.
    """
    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def runnable_tasks(samples: int = 3, pause: float = 0.005) -> int | None:
    """The median count of runnable tasks of other processes on this machine (``/proc/loadavg``), plus one for
    this process; None off Linux. This process's own running threads are not other work: the thread pool
    decoding the next batch while the feature pass is prepared must not halve the pass's threads
    (measured: a streamed 8,000-image SimpleCIL add-task passed 345 images/s on 1 thread instead of 2)."""
    counts = []
    for i in range(samples):
        machine = machine_running_tasks()
        if machine is None:
            return None
        counts.append(max(1, machine - own_running_threads() + 1))
        if i + 1 < samples:
            time.sleep(pause)
    return sorted(counts)[len(counts) // 2]


def machine_running_tasks() -> int | None:
    """The tasks running or runnable on this machine now, every process's threads (``/proc/loadavg``); None
    off Linux."""
    try:
        return int(Path("/proc/loadavg").read_text(encoding="ascii").split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def own_running_threads() -> int:
    """This process's threads that are running or runnable now (state R in ``/proc/self/task``; at least 1, the
    caller's; 1 where the system does not say)."""
    running = 0
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return 1
    for task in tasks:
        try:
            stat = (task / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:  # the thread ended since the listing
            continue
        fields = stat.rpartition(")")[2].split()
        running += bool(fields) and fields[0] == "R"
    return max(1, running)


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system says, else every core)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def check_cpu_threads(threads: int | None, option: str = "--threads") -> None:
    """A thread count asked for: at least 1 and at most the cores this machine has.

    More threads than cores only contend (the OpenMP pool starts them all: ``--threads 5000`` started
    about 10,000 threads on 2 cores and starved the machine; 100,000 crashed).

    Raises:
        ConfigError: one sentence with the machine's core count.
    """
    if threads is None:
        return
    cores = cpu_cores()
    if not 1 <= threads <= cores:
        raise ConfigError(f"{option} {threads} is outside 1..{cores}, the CPU cores this machine has; "
                          f"give at most {cores} (or leave it out: sbcli then uses the cores other work leaves free).")


def free_threads(limit: int, cores: int | None = None, running: int | None = None) -> int:
    """Threads for a CPU computation that starts now: the cores that other running work leaves free (at least 1, at most ``limit``)."""
    running = runnable_tasks() if running is None else running
    if running is None:
        return limit
    cores = cores or os.cpu_count() or 1
    return max(1, min(limit, cores - max(0, running - 1)))


@contextmanager
def compute_threads(threads: int | None) -> Iterator[None]:
    """Compute on ``threads`` CPU threads inside the block, then restore.

    None (the default): as many as the cores that other running work leaves free when the block
    starts (measured: two 2-thread trainings on 2 cores ran 35x slower each than one alone; one
    thread each shared the machine evenly; docs/lab/performance.md)."""
    before = torch.get_num_threads()
    if threads is None:
        threads = free_threads(before)
    torch.set_num_threads(min(threads, cpu_cores()))  # a learner's recorded count may be another machine's
    try:
        yield
    finally:
        torch.set_num_threads(before)
