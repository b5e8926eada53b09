"""The models one ``sb serve`` process serves, by name, each with its versions and its reload.

Every source on the command line is an ``.onnx`` file, a learner directory, a Triton model folder
or a Triton model repository (every model folder in it); a model's name is the file's stem or the
folder's name, and two models of one name are refused before anything loads
(:func:`sbcli.serve.source.expand`). Each model (:class:`Served`) keeps what ``/predict`` serves
(its source's current step), its versions (:class:`sbcli.serve.versions.Registry`) and its reload
state; :class:`Models` holds them all, polls their sources, lists their versions, and, started with
``--model-control-mode explicit`` (as Triton; otherwise a client's load or unload is refused with
400), loads or unloads one on request the way Triton's explicit model control does: an unloaded model answers
404 and is listed ``UNAVAILABLE`` in the repository index until it is loaded again; a model folder
added to a repository on the command line after the start is loaded by name.

Changes to the set (reloads, loads, unloads, version listings) happen one at a time, under one
lock; requests never wait for it: each holds the model object it looked up until it is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sbcli.errors import SbcliError
from sbcli.serve import source as sources
from sbcli.serve.limits import HTTPError
from sbcli.serve.classifier import OnnxClassifier
from sbcli.serve.versions import PendingVersion, Registry

logger = logging.getLogger(__name__)
READY, UNAVAILABLE, LOADING = "READY", "UNAVAILABLE", "LOADING"  # Triton's model states
PENDING = "not exported yet: the first request for this version exports it"


@dataclass
class Served:
    """One model: its name and source, the model ``/predict`` serves, its versions, its reload state."""

    name: str
    source: Path
    registry: Registry
    loaded: sources.Loaded | None = None
    failing: str | None = None  # why the last changed source did not load (None: serving the latest)
    reloads: int = 0
    unloaded: bool = False
    watcher: sources.Watcher | None = None

    @property
    def ready(self) -> bool:
        return not self.unloaded and self.loaded is not None and self.registry.ready and self.failing is None

    def index(self) -> list[dict[str, str]]:
        """Its entries in Triton's repository index: one per version, or one saying why there is none."""
        if self.unloaded:
            return [{"name": self.name, "state": UNAVAILABLE, "reason": "unloaded"}]
        if not self.registry.versions:
            return [{"name": self.name, "state": LOADING, "reason": ""}]
        state = READY if self.ready else UNAVAILABLE
        reason = self.failing or self.registry.failing or ""
        return [{"name": self.name, "version": str(n), "state": state, "reason": reason} if n in self.registry.versions
                else {"name": self.name, "version": str(n), "state": UNAVAILABLE, "reason": PENDING}
                for n in self.registry.numbers]

    def describe(self) -> dict[str, Any]:
        assert self.loaded is not None
        return {"name": self.name, **self.loaded.model.describe(), "source": str(self.source),
                "model_version": self.loaded.version, "reloads": self.reloads}


@dataclass
class Models:
    """Every model served, in the order given (``cfg``: the server's ServeConfig)."""

    cfg: Any
    served: dict[str, Served] = field(init=False)
    repositories: list[Path] = field(init=False)  # where a model loaded by name may be found later
    _lock: asyncio.Lock | None = None
    _background: set[asyncio.Task] = field(default_factory=set)  # exports started for a request that did not wait

    def __post_init__(self) -> None:
        self.served = {name: self._new(name, path) for name, path in sources.expand(self.cfg.sources).items()}
        self.repositories = [p for p in self.cfg.sources if sources.is_triton_repository(p)]

    def _new(self, name: str, path: Path) -> Served:
        cfg = self.cfg
        return Served(name, path, Registry(path, cfg.provider, cfg.threads, cfg.gpu(), cfg.exporter))

    @property
    def names(self) -> str:
        return ", ".join(repr(n) for n in self.served)

    @property
    def live(self) -> list[Served]:
        return [s for s in self.served.values() if not s.unloaded]

    @property
    def ready(self) -> bool:
        """Every model not unloaded is ready (and one at least is served)."""
        return bool(self.live) and all(s.ready for s in self.live)

    def open(self, served: Served, version: int = 1) -> sources.Loaded:
        """``served``'s source opened (a learner exported first): blocking."""
        cfg = self.cfg
        return sources.load(served.source, cfg.provider, cfg.threads, version, gpu=cfg.gpu(), exporter=cfg.exporter)

    def load_all(self) -> None:
        """Open every model not open yet (blocking: at startup, before the server listens)."""
        for served in self.live:
            if served.loaded is None:
                start = time.perf_counter()
                self._serve(served, self.open(served))
                logger.debug("Opened %s in %.2f s (its current version)", served.source, time.perf_counter() - start)

    @staticmethod
    def _serve(served: Served, loaded: sources.Loaded) -> None:
        served.loaded, served.unloaded, served.failing = loaded, False, None
        served.watcher = sources.Watcher(served.source, loaded.signature)

    def find(self, name: str) -> Served:
        """The model ``name``, loaded. Raises HTTPError 404 (unknown, or unloaded) or 503 (still loading)."""
        served = self.served.get(name)
        if served is None:
            raise HTTPError(404, f"Model {name!r} is not served here; this server serves {self.names}.")
        if served.unloaded:
            raise HTTPError(404, f"Model {name!r} is unloaded; load it with POST /v2/repository/models/{name}/load.")
        if served.loaded is None:
            raise HTTPError(503, f"Model {name!r} is still loading; retry when /v2/health/ready answers 200.")
        return served

    def lookup(self, name: str, version: str | None) -> tuple[Served, int, OnnxClassifier]:
        """The version of ``name`` asked for (default: the latest). Raises HTTPError 404 or 503."""
        served = self.find(name)
        if not served.registry.versions:
            raise HTTPError(503, f"Model {name!r} is still loading; retry when /v2/health/ready answers 200.")
        try:
            number, model = served.registry.get(version)
        except KeyError as err:
            raise HTTPError(404, f"Model {name!r} {err.args[0]}.") from err
        except PendingVersion as pending:
            self._export_soon(served, pending.number)
            raise HTTPError(503, f"Model {name!r} version {pending.number} is being exported for its first request; "
                                 "retry in a few seconds.", {"Retry-After": "5"}) from pending
        return served, number, model

    def _export_soon(self, served: Served, number: int) -> None:
        """Start exporting a pending version in the background (a caller that cannot wait was answered 503)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not in the server's event loop: nothing to start
        task = loop.create_task(self.export_version(served, number))
        self._background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and not isinstance(task.exception(), HTTPError | None):
            logger.error("Exporting a version in the background failed: %r", task.exception())

    async def resolve(self, name: str, version: str | None) -> tuple[Served, int, OnnxClassifier]:
        """:meth:`lookup`, a version not exported yet exported first (the request waits for it). Raises HTTPError."""
        served = self.find(name)
        if version and version.isdigit() and int(version) in served.registry.pending:
            await self.export_version(served, int(version))
        return self.lookup(name, version)

    async def export_version(self, served: Served, number: int) -> None:
        """Export a pending version of ``served`` (once: requests that asked meanwhile find it done). Raises HTTPError
        500 when it cannot be exported (the other versions go on serving)."""
        async with self.changing() as loop:
            if number not in served.registry.pending:
                return
            try:
                await loop.run_in_executor(None, served.registry.export_pending, number)
            except SbcliError as err:
                logger.warning("Could not export version %d of %s: %s", number, served.source, err)
                raise HTTPError(500, f"Model {served.name!r} version {number} could not be exported: "
                                     f"{str(err).rstrip('.')}.") from err
        logger.info("Exported version %d of %s on its first request", number, served.source)

    def for_predict(self, name: str | None) -> Served:
        """The model ``/predict`` answers with: the one served, or the one ``?model=`` names when there are several."""
        if name is None:
            if len(self.served) > 1:
                raise HTTPError(400, f"This server serves {len(self.served)} models ({self.names}); name one with ?model=NAME.")
            name = next(iter(self.served))
        return self.find(name)

    def versions(self) -> list[tuple[str, int, bool]]:
        """(model, version, default) of every version served."""
        out = []
        for served in self.live:
            listed = sorted(served.registry.versions)
            out += [(served.name, n, n == listed[-1]) for n in listed]
        return out

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every version of every model, with its state."""
        entries = [entry for served in self.served.values() for entry in served.index()]
        return [e for e in entries if e["state"] == READY] if ready_only else entries

    @contextlib.asynccontextmanager
    async def changing(self) -> AsyncIterator[asyncio.AbstractEventLoop]:
        """Hold the lock under which the set changes; yields the running loop (blocking work goes to its executor)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            yield asyncio.get_running_loop()

    def sync(self, served: Served, loaded: sources.Loaded) -> None:
        """List ``served``'s versions beside ``loaded`` (blocking: exports, loads); a failure is logged and kept."""
        try:
            served.registry.sync(loaded)
            served.registry.failing = None
        except SbcliError as err:
            logger.warning("Kept the versions served: %s could not be listed in full (%s)", served.source, err)
            served.registry.failing = str(err)
            served.registry.synced = loaded  # tried once; the next reload tries again

    async def follow(self, interval_s: float) -> None:
        """List the versions of every model, again after each reload (the first listing warms every model)."""
        while True:
            for served in list(self.served.values()):
                if served.loaded is not None and served.loaded is not served.registry.synced:
                    async with self.changing() as loop:
                        if served.loaded is not None:
                            await loop.run_in_executor(None, self.sync, served, served.loaded)
            await asyncio.sleep(interval_s)

    async def watch(self, interval_s: float) -> None:
        """Poll every source; load a changed model beside the old one and swap it in."""
        while True:
            await asyncio.sleep(interval_s)
            for served in list(self.served.values()):
                if served.loaded is not None and served.watcher is not None and served.watcher.due():
                    async with self.changing() as loop:
                        await self._reload(served, loop)

    async def _reload(self, served: Served, loop: asyncio.AbstractEventLoop) -> None:
        if served.loaded is None or served.watcher is None:
            return  # unloaded meanwhile
        current = served.loaded.version
        try:
            new = await loop.run_in_executor(None, self.open, served, current + 1)
        except SbcliError as err:
            logger.warning("Kept model version %d: the changed %s did not load (%s)", current, served.source, err)
            served.watcher.failed()
            served.failing = str(err)
            return
        served.loaded, served.reloads, served.failing = new, served.reloads + 1, None
        served.watcher.current = new.signature
        logger.info("Reloaded %s: now model version %d", served.source, new.version)

    def _discover(self, name: str) -> Served:
        """A model folder ``name`` added to a repository on the command line since the start. Raises HTTPError 404."""
        for repository in self.repositories:
            folder = repository / name
            if not name.startswith(".") and sources.is_triton_model(folder) and sources.model_name(folder) == name:
                self.served[name] = self._new(name, folder)
                return self.served[name]
        where = f" nor in {', '.join(map(str, self.repositories))}" if self.repositories else ""
        raise HTTPError(404, f"Model {name!r} is not served here{where}; this server serves {self.names}.")

    def _explicit(self, action: str) -> None:
        """Refuse a client's load or unload unless the server was started in explicit model control mode (as Triton)."""
        if self.cfg.model_control_mode != "explicit":
            raise HTTPError(400, f"Explicit model {action} is not allowed: this server was started without "
                                 "--model-control-mode explicit.")

    async def load(self, name: str) -> None:
        """Load (or reload) ``name`` from its source and list its versions, as Triton's explicit load does.

        Raises:
            HTTPError: 404 (no such model), 400 (not in explicit model control mode, or its source does not load: the
                old one, if any, still serves).
        """
        self._explicit("load")
        async with self.changing() as loop:
            served = self.served.get(name) or self._discover(name)
            version = served.loaded.version + 1 if served.loaded is not None else 1
            try:
                new = await loop.run_in_executor(None, self.open, served, version)
            except SbcliError as err:
                raise HTTPError(400, f"Model {name!r} did not load: {str(err).rstrip('.')}.") from err
            self._serve(served, new)
            await loop.run_in_executor(None, self.sync, served, new)
        logger.info("Loaded model %s (model version %d)", name, new.version)

    async def unload(self, name: str) -> None:
        """Stop serving ``name`` (requests already holding it finish). Raises HTTPError 404 for an unknown model, 400
        when the server is not in explicit model control mode."""
        self._explicit("unload")
        async with self.changing():
            served = self.served.get(name)
            if served is None:
                raise HTTPError(404, f"Model {name!r} is not served here; this server serves {self.names}.")
            served.loaded, served.watcher, served.failing, served.unloaded = None, None, None, True
            served.registry.versions, served.registry.synced, served.registry.failing = {}, None, None
        logger.info("Unloaded model %s", name)
