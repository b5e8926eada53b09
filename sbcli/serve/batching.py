"""Dynamic batching: images from concurrent requests are scored together.

Each request submits its decoded images one by one; a single loop takes the first waiting image,
then waits at most ``max_wait_ms`` for more, up to ``max_batch_size``, and scores them in one
model call on a worker thread (one call at a time: onnxruntime already uses every core inside one
call). Every image carries the model it was preprocessed for, so a reload (a new model object)
never mixes in a batch, and images already queued finish on the model they started with.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sbcli.errors import ConfigError


@dataclass(frozen=True)
class BatchConfig:
    """At most ``max_batch_size`` images per model call; wait at most ``max_wait_ms`` to fill one."""

    max_batch_size: int = 32
    max_wait_ms: float = 5.0

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError("--max-batch-size must be at least 1.")
        if not 0 <= self.max_wait_ms < math.inf:  # NaN fails this too
            raise ConfigError("--max-wait-ms must be a finite number of at least 0.")


@dataclass
class _Item:
    model: Any  # a Classifier: has scores(images) -> np.ndarray
    image: np.ndarray  # float32 [3, H, W]
    future: asyncio.Future
    queued: float = field(default_factory=time.perf_counter)


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
    """Collects images into batches; start() inside the event loop, then ``await submit(...)``.

    ``observer``, when set, hears of every model call: (batch size, each image's wait, the call's seconds).
    """

    cfg: BatchConfig
    stats: BatchStats = field(default_factory=BatchStats)
    observer: Callable[[int, list[float], float], None] | None = None
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

    async def submit(self, model: Any, image: np.ndarray) -> np.ndarray:
        """The scores of one image (float32 [3, H, W]) from ``model``, computed in some batch."""
        assert self._queue is not None, "Batcher.start() was not called"
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Item(model, image, future))
        return await future

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
            await self._run(first.model, batch)

    async def _run(self, model: Any, batch: list[_Item]) -> None:
        live = [item for item in batch if not item.future.done()]  # a client that went away cancelled its future
        if not live:
            return
        try:
            images = np.stack([item.image for item in live])
            start = time.perf_counter()
            scores = await asyncio.get_running_loop().run_in_executor(self._pool, model.scores, images)
            if self.observer is not None:
                self.observer(len(live), [start - item.queued for item in live], time.perf_counter() - start)
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
