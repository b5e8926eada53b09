"""The ``sb serve`` HTTP application (Starlette on uvicorn).

Routes: ``POST /predict`` (multipart image files, JSON ``{"images": [base64, ...]}`` or one raw
image body; ``top_k`` as a query parameter or JSON field; ``model`` as a query parameter, needed
when several models are served), ``GET /health``, ``GET /metadata``; the Open Inference Protocol
under ``/v2`` with Triton's extensions and ``GET /metrics`` (:mod:`sbcli.serve.oip`,
:mod:`sbcli.serve.oip_triton`); the gRPC protocol beside it with ``grpc_listen``
(:mod:`sbcli.serve.grpc_service`, started in the lifespan, so that both share one batcher).
Requests are refused before they are read whole when they are too large: at once from their
Content-Length, else while streaming; when the bodies in flight would pass the server's byte
budget (503), or do not arrive within the request timeout (408); past ``max_queue`` requests waiting
for the batcher a request is 503 at once, ``Retry-After`` set. A bad image is a 400 with one
sentence; the server goes on. Every refusal, 404 and 405 included, is ``{"error": "..."}``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from sbcli.serve import limits
from sbcli.serve.batching import BatchConfig, Batcher
from sbcli.serve.infer import admit, score
from sbcli.serve.limits import HTTPError, parse_json, read_body, refusal
from sbcli.serve.served_models import Models
from sbcli.serve.predict import top_k as rank
from sbcli.serve.stats import StatsBook

logger = logging.getLogger(__name__)
CONFIG_ENV = "SBCLI_SERVE_CONFIG"
INFLIGHT_PER_REQUEST = 4  # the default byte budget: four requests of the largest size at once
DEFAULT_REQUEST_TIMEOUT_S = 60.0  # a 16 MiB body at about 2.2 Mbit/s
DEFAULT_MAX_QUEUE = 128  # requests waiting for the batcher: a second's worth at 128 images/s, batched
RAW_IMAGE_KINDS = ("image/", "application/octet-stream")
CONTROL_MODES = ("none", "explicit")  # Triton's --model-control-mode, less "poll": sb serve's reload is --reload-interval
DEFAULT_HEADER_TIMEOUT_S = 10.0  # a request head is a few hundred bytes: a client that needs longer holds a half-open socket
DEFAULT_PER_CLIENT = 64  # connections from one address; a browser opens 6 at most, a load balancer tens


@dataclass(frozen=True)
class ServeConfig:
    """Everything a server process needs (JSON in $SBCLI_SERVE_CONFIG for ``--workers`` > 1).

    ``model``: one source or several (:func:`sbcli.serve.source.expand`: files, learner directories,
    Triton model folders and repositories).
    """

    model: str | Sequence[str]
    provider: str = "auto"
    top_k: int = 5
    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_request_bytes: int = 16 * 2**20
    max_images: int = 64
    reload_interval_s: float = 2.0  # 0: never reload
    threads: int | None = None
    cuda_graph: bool = False  # the GPU options (sbcli.serve.gpu)
    trt_fp16: bool = False
    trt_cache: str | None = None
    max_image_pixels: int = limits.DEFAULT_MAX_IMAGE_PIXELS  # decoded pixels, checked from the header first
    max_request_pixels: int = limits.DEFAULT_MAX_REQUEST_PIXELS  # also the most decoded at once, server-wide
    exporter: str | None = None  # the module that exports a learner directory (sbcli.serve.source.LearnerExporter)
    max_inflight_bytes: int | None = None  # bytes of all bodies held at once (None: 4 x max_request_bytes)
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S  # for a request head, and then for its body, to arrive
    max_connections: int | None = None  # open at once (None: 512, fewer where the open-file limit is lower)
    max_queue: int = DEFAULT_MAX_QUEUE  # requests waiting for the batcher at once; one more is a 503
    grpc_listen: str | None = None  # "host:port" of the gRPC protocol (None: HTTP only)
    model_control_mode: str = "none"  # Triton's: "explicit" lets clients load and unload models, "none" refuses both
    metrics_port: int = 0  # GET /metrics alone on a port of its own as well (Triton's 8002; 0: only on the main port)
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S  # for a request head to arrive (at most request_timeout_s)
    max_connections_per_client: int | None = None  # open at once from one address (None: DEFAULT_PER_CLIENT, at most all)

    @property
    def sources(self) -> tuple[Path, ...]:
        return (Path(self.model),) if isinstance(self.model, str | os.PathLike) else tuple(map(Path, self.model))

    def gpu(self) -> Any:
        """The GPU options as :class:`sbcli.serve.gpu.GpuOptions` (None when all are off: the providers' defaults)."""
        from sbcli.serve.gpu import GpuOptions

        options = GpuOptions(self.cuda_graph, self.trt_fp16, self.trt_cache)
        return None if options == GpuOptions() else options

    @property
    def inflight_bytes(self) -> int:
        return self.max_inflight_bytes if self.max_inflight_bytes is not None else INFLIGHT_PER_REQUEST * self.max_request_bytes

    @property
    def connections(self) -> int:
        from sbcli.serve.guard import default_max_connections  # uvicorn's protocol: imported by a server only

        return self.max_connections if self.max_connections is not None else default_max_connections()

    @property
    def per_client(self) -> int:
        """Connections one address may hold at once (at most all of them)."""
        wanted = self.max_connections_per_client if self.max_connections_per_client is not None else DEFAULT_PER_CLIENT
        return min(wanted, self.connections)

    @property
    def request_limits(self) -> limits.RequestLimits:
        return limits.RequestLimits(self.max_request_bytes, self.max_images, self.max_image_pixels, self.max_request_pixels)

    def to_env(self) -> str:
        return json.dumps({**asdict(self), "model": [str(p) for p in self.sources]})

    @classmethod
    def from_env(cls) -> ServeConfig:
        fields = json.loads(os.environ[CONFIG_ENV])
        return cls(**{**fields, "model": tuple(fields["model"])})


@dataclass
class Server:
    """The state of one server process: the models served (and their reloads), the batcher, the budgets, the statistics."""

    cfg: ServeConfig
    models: Models = field(init=False)  # refuses unservable sources and duplicate names before anything loads
    batcher: Batcher = field(init=False)
    budget: limits.PixelBudget = field(init=False)
    inflight: limits.ByteBudget = field(init=False)  # request bodies held, by every request together
    stats: StatsBook = field(default_factory=StatsBook)  # Triton's statistics, per model version
    started: float = field(default_factory=time.time)
    metrics: Any = None  # sbcli.serve.prometheus.Metrics, set by create_app

    def __post_init__(self) -> None:
        self.models = Models(self.cfg)
        self.batcher = Batcher(BatchConfig(self.cfg.max_batch_size, self.cfg.max_wait_ms, self.cfg.max_queue))
        self.budget = limits.PixelBudget(self.cfg.max_request_pixels)
        self.inflight = limits.ByteBudget(self.cfg.inflight_bytes)

    @property
    def source(self) -> Path:
        return self.cfg.sources[0]

    @property
    def loaded(self) -> Any:
        """The first model's :class:`sbcli.serve.source.Loaded` (the model, when one is served)."""
        return next(iter(self.models.served.values())).loaded

    @property
    def failing(self) -> str | None:
        """Why a changed source did not load (the first model's that failed; None: serving every latest)."""
        return next((s.failing for s in self.models.served.values() if s.failing is not None), None)

    def load(self) -> None:
        self.models.load_all()

    def sync(self) -> None:
        """List every model's versions now (blocking; the lifespan does it in the background)."""
        for served in self.models.live:
            if served.loaded is not None:
                self.models.sync(served, served.loaded)

    def server_wide(self) -> dict[str, Any]:
        return {"batching": {**asdict(self.batcher.cfg), **self.batcher.stats.to_json(), "waiting": self.batcher.waiting},
                "limits": {**self.cfg.request_limits.to_json(), "max_inflight_bytes": self.cfg.inflight_bytes,
                           "request_timeout_s": self.cfg.request_timeout_s, "max_connections": self.cfg.connections,
                           "header_timeout_s": min(self.cfg.header_timeout_s, self.cfg.request_timeout_s),
                           "max_connections_per_client": self.cfg.per_client},
                "top_k": self.cfg.top_k}

    def metadata(self, name: str | None = None) -> dict[str, Any]:
        """The model's description with the server's settings; with several models (and no ``name``), all of them."""
        if name is not None or len(self.models.served) == 1:
            return {**self.models.for_predict(name).describe(), **self.server_wide()}
        return {"models": [s.describe() for s in self.models.live if s.loaded is not None], **self.server_wide()}


def _b64(text: Any, index: int) -> bytes:
    if not isinstance(text, str):
        raise HTTPError(400, f"Image {index} in the JSON body is not a base64 string.")
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]  # a data: URL
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise HTTPError(400, f"Image {index} in the JSON body is not valid base64 ({err}).") from err


async def _multipart(request: Request, body: bytes, max_images: int, max_bytes: int) -> tuple[list[tuple[str, bytes]], dict]:
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(max_files=max_images, max_fields=16, max_part_size=max_bytes)
    except Exception as err:  # Starlette raises HTTPException / MultiPartException for malformed bodies
        detail = str(getattr(err, "detail", err)).rstrip(".")
        if "Too many files" in detail:
            raise HTTPError(413, f"The request holds more than the {max_images} images this server accepts.") from err
        raise HTTPError(400, f"The multipart body cannot be read ({detail}).") from err
    images, options = [], {}
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(form.close)
        for key, value in form.multi_items():
            if hasattr(value, "read"):
                images.append((value.filename or key, await value.read()))
            elif key == "top_k":
                options["top_k"] = value
    return images, options


def _json_images(body: bytes) -> tuple[list[tuple[str, bytes]], dict]:
    data = parse_json(body)
    if not isinstance(data, dict) or not ({"images", "image"} & data.keys()):
        raise HTTPError(400, 'The JSON body needs "images": a list of base64 strings (or "image": one).')
    raw = data.get("images", [data.get("image")])
    if not isinstance(raw, list):
        raise HTTPError(400, '"images" must be a list of base64 strings.')
    return [(f"#{i}", _b64(text, i)) for i, text in enumerate(raw)], {k: v for k, v in data.items() if k == "top_k"}


def content_kind(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def body_copies(request: Request) -> int:
    """How many times a /predict body is held: once raw; twice when parsing copies it (multipart files, base64 in JSON)."""
    return 1 if content_kind(request).startswith(RAW_IMAGE_KINDS) else 2


async def images_of(request: Request, body: bytes, max_images: int, max_bytes: int) -> tuple[list[tuple[str, bytes]], dict]:
    """(name, bytes) of every image in the request, and the options sent with them (``top_k``)."""
    kind = content_kind(request)
    if kind == "multipart/form-data":
        images, options = await _multipart(request, body, max_images, max_bytes)
    elif kind == "application/json":
        images, options = _json_images(body)
    elif kind.startswith(RAW_IMAGE_KINDS):
        images, options = [("#0", body)], {}
    else:
        raise HTTPError(415, "Send images as multipart/form-data files, JSON with base64 strings, or one raw image body.")
    if not images:
        raise HTTPError(400, "The request holds no image.")
    if len(images) > max_images:
        raise HTTPError(413, f"The request holds {len(images)} images, more than the {max_images} this server accepts.")
    return images, options


def _top_k(value: Any, default: int) -> int:
    if value is None:
        return default
    try:
        k = int(value)
    except (TypeError, ValueError):
        k = 0
    if k < 1:
        raise HTTPError(400, "top_k must be a whole number of at least 1.")
    return k


async def _predictions(server: Server, request: Request, lease: limits.Lease, model: Any, record: Any) -> list:
    """The top-k predictions of the images ``request`` sends, by ``model`` (``record``: the request's statistics)."""
    admit(server)
    body = await read_body(request, server.cfg.max_request_bytes, lease, copies=body_copies(request),
                           timeout_s=server.cfg.request_timeout_s)
    images, options = await images_of(request, body, server.cfg.max_images, server.cfg.max_request_bytes)
    k = _top_k(request.query_params.get("top_k", options.get("top_k")), server.cfg.top_k)
    with record.stage("input_s"):
        decoded = await limits.decode_within(model.preprocess, images, server.cfg.request_limits, server.budget)
        batch = model.preprocess.to_input(list(decoded))
    if server.metrics is not None:
        server.metrics.images_decoded("/predict", len(decoded))
    scores = await score(server, record.key, model, batch, record)
    with record.stage("output_s"):
        return rank(scores, model.class_names, k, [name for name, _ in images])


async def answer_predict(server: Server, request: Request) -> JSONResponse:
    """``POST /predict``: top-k labels of each image, by the model ``?model=`` names (or the one served)."""
    with server.inflight.lease() as lease:  # the body and its parsed copy, held until the answer
        try:
            served = server.models.for_predict(request.query_params.get("model"))
            loaded = served.loaded  # one model for the whole request, even if a reload happens meanwhile
            model = loaded.model
            with server.stats.request((served.name, served.registry.number(model))) as record:
                predictions = await _predictions(server, request, lease, model, record)
        except HTTPError as err:
            return refusal(err)
        except Exception as err:  # the model itself failed: logged with its traceback, answered as a 500
            logger.exception("The model failed on a request")
            return JSONResponse({"error": f"The model failed on this request ({type(err).__name__}); see the server log."},
                                status_code=500)
    answer = {"model_version": loaded.version, "provider": model.provider, "predictions": [p.to_json() for p in predictions]}
    return JSONResponse({"model": served.name, **answer} if len(server.models.served) > 1 else answer)


def create_app(server: Server) -> Starlette:
    """The Starlette app over ``server`` (which loads its model at startup if not loaded yet)."""
    from starlette.middleware import Middleware

    from sbcli.serve.prometheus import MetricsMiddleware, MetricsPortOnly
    from sbcli.serve.oip import mount

    protocol = mount(server)
    server.metrics = protocol.metrics
    limits.start_policy()

    async def predict(request: Request) -> JSONResponse:
        return await answer_predict(server, request)

    async def health(_: Request) -> JSONResponse:
        models = {s.name: {"model_version": s.loaded.version, "provider": s.loaded.model.provider}
                  for s in server.models.live if s.loaded is not None}
        if len(server.models.served) == 1 and models:
            return JSONResponse({"status": "ok", **next(iter(models.values()))})
        return JSONResponse({"status": "ok", "models": models})

    async def metadata(request: Request) -> JSONResponse:
        try:
            return JSONResponse(server.metadata(request.query_params.get("model")))
        except HTTPError as err:
            return refusal(err)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[dict[str, Any]]:
        from sbcli.serve.guard import STATE_KEY, ConnectionGuard

        server.load()
        server.batcher.start()
        tasks = [protocol.follow()]
        if server.cfg.reload_interval_s > 0:
            tasks.append(asyncio.get_running_loop().create_task(server.models.watch(server.cfg.reload_interval_s)))
        grpc = await start_grpc(server) if server.cfg.grpc_listen else None
        try:  # the state reaches sbcli.serve.guard.GuardedProtocol, which runs under uvicorn beside the app
            cfg = server.cfg
            yield {STATE_KEY: ConnectionGuard(cfg.request_timeout_s, cfg.connections, cfg.header_timeout_s, cfg.per_client)}
        finally:
            if grpc is not None:
                await grpc.stop(1.0)
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await server.batcher.stop()

    routes = [Route("/predict", predict, methods=["POST"]), Route("/health", health, methods=["GET"]),
              Route("/metadata", metadata, methods=["GET"]), *protocol.routes]
    counted = Middleware(MetricsMiddleware, metrics=protocol.metrics, routes=routes)
    ports = [Middleware(MetricsPortOnly, port=server.cfg.metrics_port)] if server.cfg.metrics_port else []
    return Starlette(routes=routes, lifespan=lifespan, middleware=[*ports, counted],
                     exception_handlers={404: not_routed, 405: not_routed})


async def not_routed(request: Request, exc: Exception) -> JSONResponse:
    """404 and 405 as ``{"error": ...}`` like every other answer (a protocol client parses errors as JSON)."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        sentence = f"{request.method} is not allowed on {path}; use {allowed}."
    else:
        sentence = f"{path} is not a route of this server; see GET /metadata, or GET /v2 for the Open Inference Protocol."
    return JSONResponse({"error": sentence}, status_code=exc.status_code, headers=exc.headers)


async def start_grpc(server: Server) -> Any:
    """The gRPC protocol's server, listening on ``server.cfg.grpc_listen`` in this event loop (imported only here:
    plain ``sb serve`` needs no grpcio)."""
    from sbcli.serve.grpc_service import start

    return await start(server)


def app_from_env() -> Starlette:
    """The app of one ``--workers`` process (uvicorn's factory), configured by $SBCLI_SERVE_CONFIG."""
    return create_app(Server(ServeConfig.from_env()))
