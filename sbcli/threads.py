"""Compute threads: how sbcli's torch work shares a CPU with everything else running on it.

torch's CPU kernels run on OpenMP threads, one per core by default. With OpenMP's default waiting
policy a thread that finishes its share of a parallel region spins for a while before it sleeps;
when another process holds a core, that spinning steals the time the late thread needs, and a
training step collapses (measured in docs/performance.md: benchmarks/threads_under_load.py).
:func:`prepare` therefore makes waiting threads sleep (``OMP_WAIT_POLICY=PASSIVE``), which must
happen before torch is imported: the CLI's entry point calls it first. A value the user set in
the environment is kept.

:func:`use_threads` sets how many threads to use (``sb --threads N`` or ``SBCLI_THREADS``); the
default stays torch's, one per core.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

ENV_THREADS = "SBCLI_THREADS"
MAX_THREADS = 1024
# OMP_WAIT_POLICY is the standard name (GNU libgomp, which torch's Linux wheels use, and LLVM's
# libomp); KMP_BLOCKTIME=0 is the same request to Intel's runtime, for builds that use it.
PASSIVE_WAITING = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}


def prepare(environ: MutableMapping[str, str] = os.environ) -> None:
    """Before torch loads: waiting compute threads sleep instead of spinning (unless the user said otherwise)."""
    for key, value in PASSIVE_WAITING.items():
        environ.setdefault(key, value)


def use_threads(threads: int | None, environ: MutableMapping[str, str] = os.environ) -> None:
    """Run torch's CPU work on ``threads`` threads (None: keep torch's default, one per core).

    Before torch is imported this sets ``OMP_NUM_THREADS`` (read by torch when it starts); after,
    it calls ``torch.set_num_threads`` as well.

    Raises:
        ValueError: ``threads`` is not between 1 and MAX_THREADS.
    """
    if threads is None:
        return
    if not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"threads must be between 1 and {MAX_THREADS}, got {threads}")
    environ["OMP_NUM_THREADS"] = environ["MKL_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
