"""Dynamic batching: images from concurrent requests are scored together.

A request hands the batcher all its decoded images at once (:meth:`Batcher.infer`); a single loop
takes the first waiting image, then waits at most ``max_wait_ms`` for more, up to
``max_batch_size``, and scores them in one model call on a worker thread (one call at a time:
onnxruntime already uses every core inside one call). Every image carries the model it was
preprocessed for, so a reload (a new model object) or another model never mixes in a batch, and
images already queued finish on the model they started with.

Back-pressure: a request *waits* from the moment it is handed in until its last image is taken
into a model call. At most ``max_queue`` requests wait at once; one more is refused at once
(:class:`QueueFull`, which the routes answer 503) rather than queued without bound, so a burst
past what the model can score costs neither memory nor the latency of the requests accepted.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sbcli.errors import ConfigError

Observer = Callable[[Hashable, int, list[float], float], None]


class QueueFull(Exception):
    """The batcher already holds ``max_queue`` requests waiting for a model call."""

    def __init__(self, waiting: int) -> None:
        super().__init__(f"{waiting} requests are already waiting for the model")
        self.waiting = waiting


@dataclass(frozen=True)
class BatchConfig:
    """At most ``max_batch_size`` images per model call; wait at most ``max_wait_ms`` to fill one."""

    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_queue: int | None = None  # requests waiting at once (None: no bound)

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError("--max-batch-size must be at least 1.")
        if not 0 <= self.max_wait_ms < math.inf:  # NaN fails this too
            raise ConfigError("--max-wait-ms must be a finite number of at least 0.")
        if self.max_queue is not None and self.max_queue < 1:
            raise ConfigError("--max-queue must be at least 1.")


@dataclass
class Timing:
    """One request's time in the batcher: waiting until its last image was taken into a model call, the
    model calls its images were in (each call's whole duration, as Triton counts it) and how many."""

    queue_s: float = 0.0
    infer_s: float = 0.0
    executions: int = 0


@dataclass(eq=False)
class _Group:
    """The images of one request: ``left`` of them not yet taken into a model call."""

    key: Hashable
    left: int
    queued: float = field(default_factory=time.perf_counter)
    timing: Timing = field(default_factory=Timing)


@dataclass
class _Item:
    model: Any  # a Classifier: has scores(images) -> np.ndarray
    image: np.ndarray  # float32 [3, H, W]
    future: asyncio.Future
    group: _Group


@dataclass
class BatchStats:
    """How many model calls ran and how many images they scored (mean batch = images / batches)."""

    batches: int = 0
    images: int = 0
    largest: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"batches": self.batches, "images": self.images, "largest": self.largest,
                "mean_batch": self.images / self.batches if self.batches else 0.0}


@dataclass
class Batcher:
    """Collects images into batches; start() inside the event loop, then ``await infer(...)``.

    ``observer``, when set, hears of every model call: (the key its requests named, batch size, each
    image's wait, the call's seconds). ``waiting`` counts the requests waiting, ``pending`` them by key.
    """

    cfg: BatchConfig
    stats: BatchStats = field(default_factory=BatchStats)
    observer: Observer | None = None
    waiting: int = 0
    pending: Counter = field(default_factory=Counter)
    _queue: asyncio.Queue | None = None
    _task: asyncio.Task | None = None
    _pool: ThreadPoolExecutor | None = None

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sbcli-infer")
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    @property
    def full(self) -> bool:
        """``max_queue`` requests are waiting: one more would be refused."""
        return self.cfg.max_queue is not None and self.waiting >= self.cfg.max_queue

    async def infer(self, model: Any, images: np.ndarray, key: Hashable = None) -> tuple[np.ndarray, Timing]:
        """The scores of ``images`` (float32 [N, 3, H, W]) from ``model``, computed in some batches, and the
        request's time in the batcher; ``key`` (the model's name and version) labels its counts.

        Raises:
            QueueFull: ``max_queue`` requests are already waiting (nothing was queued).
        """
        assert self._queue is not None, "Batcher.start() was not called"
        if self.full:
            raise QueueFull(self.waiting)
        loop = asyncio.get_running_loop()
        group = _Group(key, len(images))
        futures = [loop.create_future() for _ in range(len(images))]
        self.waiting += 1
        self.pending[key] += 1
        for image, future in zip(images, futures, strict=True):
            self._queue.put_nowait(_Item(model, image, future, group))
        try:
            rows = await asyncio.gather(*futures)
        finally:
            for future in futures:  # a failed or cancelled request: its other images are dropped, errors retrieved
                if not future.done():
                    future.cancel()
                elif not future.cancelled():
                    future.exception()
        return np.stack(rows), group.timing

    def _taken(self, batch: list[_Item]) -> None:
        """The images of ``batch`` are in a model call: a request whose last image this is waits no more."""
        now = time.perf_counter()
        for item in batch:
            group = item.group
            group.left -= 1
            if group.left == 0:
                group.timing.queue_s = now - group.queued
                self.waiting -= 1
                self.pending[group.key] -= 1
                if self.pending[group.key] == 0:
                    del self.pending[group.key]

    async def _next(self, carry: list[_Item], timeout: float | None) -> _Item | None:
        if carry:
            return carry.pop(0)
        assert self._queue is not None
        if timeout is None:
            return await self._queue.get()
        if timeout <= 0:
            return self._queue.get_nowait() if not self._queue.empty() else None
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        carry: list[_Item] = []  # taken from the queue for another model: first in the next batch
        while True:
            first = await self._next(carry, None)
            assert first is not None
            batch, later = [first], []
            deadline = loop.time() + self.cfg.max_wait_ms / 1000
            while len(batch) < self.cfg.max_batch_size:
                item = await self._next(carry, deadline - loop.time())
                if item is None:
                    break
                (batch if item.model is first.model else later).append(item)
            carry = later + carry
            self._taken(batch)
            await self._run(first.model, batch)

    async def _run(self, model: Any, batch: list[_Item]) -> None:
        live = [item for item in batch if not item.future.done()]  # a client that went away cancelled its future
        if not live:
            return
        try:
            images = np.stack([item.image for item in live])
            start = time.perf_counter()
            scores = await asyncio.get_running_loop().run_in_executor(self._pool, model.scores, images)
            seconds = time.perf_counter() - start
            for group in {id(item.group): item.group for item in live}.values():
                group.timing.infer_s += seconds
                group.timing.executions += 1
            if self.observer is not None:
                self.observer(live[0].group.key, len(live), [start - item.group.queued for item in live], seconds)
        except Exception as err:  # handed to every waiting request, which answers 500 with it
            for item in live:
                if not item.future.done():
                    item.future.set_exception(err)
            return
        self.stats.batches += 1
        self.stats.images += len(live)
        self.stats.largest = max(self.stats.largest, len(live))
        for item, row in zip(live, scores, strict=True):
            if not item.future.done():
                item.future.set_result(row)
