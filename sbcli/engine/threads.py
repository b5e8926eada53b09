"""Compute threads: how sbcli's torch work shares a CPU with everything else running on it.

torch's CPU kernels run on OpenMP threads, one per core by default. With OpenMP's default waiting
policy a thread that finishes its share of a parallel region spins for a while before it sleeps;
when another process holds a core, that spinning steals the time the late thread needs, and a
training step collapses (measured in docs/lab/performance.md: benchmarks/threads_under_load.py).
:func:`prepare` therefore makes waiting threads sleep (``OMP_WAIT_POLICY=PASSIVE``), after a brief
spin under GNU OpenMP, which torch's Linux wheels use (``GOMP_SPINCOUNT=10000``, a thirtieth of its
default): sleeping at once cost a small network 1.5x on an idle CPU, a wake-up between every two
short kernels. This must happen before torch is imported: the CLI's entry point calls it first. What
the user set in the environment is kept (a wait policy of their own gets no spin count from here).

How many threads is a separate setting (``--threads`` / ``SBCLI_THREADS``, ``TrainConfig.threads``,
applied by the engine); the default stays torch's, one per core.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

# OMP_WAIT_POLICY is the standard name (GNU libgomp, which torch's Linux wheels use, and LLVM's
# libomp); KMP_BLOCKTIME=0 is the same request to Intel's runtime, for builds that use it.
PASSIVE_WAITING = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
# GNU OpenMP spins this many iterations before it sleeps, whatever the policy says (libgomp reads it last)
SPIN_COUNT = "10000"


def prepare(environ: MutableMapping[str, str] = os.environ) -> None:
    """Before torch loads: waiting compute threads spin briefly, then sleep (unless the user said otherwise)."""
    if "OMP_WAIT_POLICY" not in environ:  # a policy the user chose is theirs whole: no spin count overrides it
        environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
    for key, value in PASSIVE_WAITING.items():
        environ.setdefault(key, value)
