"""Inference statistics per model version, in Triton's schema: what ``GET /v2/models/stats`` (and
gRPC's ModelStatistics) answer and what the ``nv_inference_*`` metrics read (:mod:`sbcli.serve.prometheus`).

One :class:`StatsBook` per server process counts, for every (model, version):

* ``success`` / ``fail``: requests answered / refused after the model was found, and their time
  (from the model's lookup to the answer); a failure also counts under its reason, Triton's labels:
  ``REJECTED`` (503: the queue or the byte budget full), ``CANCELED`` (the client left), ``BACKEND``
  (500: the model failed), ``OTHER`` (a malformed request, too large, too slow to arrive);
* ``queue``: the time a request waited for its model calls; ``compute_input`` (decoding and
  stacking its images), ``compute_infer`` (its model calls), ``compute_output`` (softmax, encoding);
* ``inference_count`` (images scored, as Triton counts each inference of a batched request) and
  ``execution_count`` (model calls), with each model call's time by batch size (``batch_stats``).

Everything runs in the server's one event loop (HTTP, gRPC and the batcher), so nothing is locked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sbcli.serve.batching import Timing

DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
REASONS = {503: "REJECTED", 499: "CANCELED", 500: "BACKEND"}  # any other status: OTHER
Key = tuple[str, int]  # (model name, version)


def reason_of(err: BaseException) -> str:
    """Triton's failure reason for the error a request ended with."""
    if isinstance(err, asyncio.CancelledError):
        return "CANCELED"
    return REASONS.get(getattr(err, "status", 500), "OTHER")


@dataclass
class Duration:
    """How many, and their nanoseconds in all (Triton's StatisticDuration)."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += max(0, round(seconds * 1e9))

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class VersionStats:
    """The counts of one model version (Triton's ModelStatistics)."""

    last_inference: int = 0  # milliseconds since the epoch of the last request answered
    inference_count: int = 0
    execution_count: int = 0
    durations: dict[str, Duration] = field(default_factory=lambda: {name: Duration() for name in DURATIONS})
    failures: Counter = field(default_factory=Counter)  # by reason
    batches: dict[int, Duration] = field(default_factory=dict)  # model calls' time, by batch size

    def to_json(self, name: str, version: int) -> dict[str, Any]:
        zero = Duration().to_json()
        return {"name": name, "version": str(version), "last_inference": self.last_inference,
                "inference_count": self.inference_count, "execution_count": self.execution_count,
                "inference_stats": {**{k: d.to_json() for k, d in self.durations.items()},
                                    "cache_hit": zero, "cache_miss": zero},
                "batch_stats": [{"batch_size": size, "compute_input": zero, "compute_infer": d.to_json(),
                                 "compute_output": zero} for size, d in sorted(self.batches.items())]}


@dataclass
class Record:
    """What one request measured on its way: its images, its stages' seconds and the batcher's timing."""

    key: Key
    started: float = field(default_factory=time.perf_counter)
    images: int = 0
    input_s: float = 0.0
    output_s: float = 0.0
    timing: Timing | None = None

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a stage (``input_s`` or ``output_s``)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, name, getattr(self, name) + time.perf_counter() - start)


@dataclass
class StatsBook:
    """Every model version's :class:`VersionStats`, created at its first count."""

    entries: dict[Key, VersionStats] = field(default_factory=dict)

    def of(self, key: Key) -> VersionStats:
        if key not in self.entries:
            self.entries[key] = VersionStats()
        return self.entries[key]

    @contextlib.contextmanager
    def request(self, key: Key) -> Iterator[Record]:
        """Count the request run inside as a success, or as a failure with the reason of the error it raises."""
        record = Record(key)
        try:
            yield record
        except BaseException as err:
            stats = self.of(key)
            stats.durations["fail"].add(time.perf_counter() - record.started)
            stats.failures[reason_of(err)] += 1
            raise
        self.succeeded(key, record)

    def succeeded(self, key: Key, record: Record) -> None:
        stats, d = self.of(key), self.of(key).durations
        d["success"].add(time.perf_counter() - record.started)
        d["compute_input"].add(record.input_s)
        d["compute_output"].add(record.output_s)
        if record.timing is not None:
            d["queue"].add(record.timing.queue_s)
            d["compute_infer"].add(record.timing.infer_s)
        stats.inference_count += record.images
        stats.last_inference = int(time.time() * 1000)

    def executed(self, key: Hashable, size: int, _waits: list[float], seconds: float) -> None:
        """One model call (the batcher's observer): ``size`` images in ``seconds``."""
        if not isinstance(key, tuple):
            return
        stats = self.of(key)
        stats.execution_count += 1
        stats.batches.setdefault(size, Duration()).add(seconds)

    def to_json(self, versions: Iterable[Key]) -> dict[str, Any]:
        """``{"model_stats": [...]}`` of ``versions`` (zeros for a version not yet asked anything)."""
        return {"model_stats": [self.entries.get((name, v), VersionStats()).to_json(name, v) for name, v in versions]}
