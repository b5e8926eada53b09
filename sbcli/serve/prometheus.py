"""``GET /metrics``: what ``sb serve`` does, in the Prometheus text format (``prometheus_client``).

Every app has its own collector registry (no process-wide state), so two servers in one process
count apart. The metrics:

* ``sbcli_requests_total{endpoint,status}`` and ``sbcli_request_failures_total{endpoint,status}``
  (status 400 and above); ``endpoint`` is the route's path template, so names do not explode.
  Status 499 (nginx's "client closed request") counts a client that left before its request
  arrived whole: nothing was answered and nothing failed, so it is not a failure;
* ``sbcli_request_duration_seconds{endpoint}``: the whole request, as the server saw it;
* ``sbcli_queue_seconds`` (an image waiting for its batch) against ``sbcli_compute_seconds`` (one
  model call) and ``sbcli_batch_size`` (images per model call);
* ``sbcli_images_decoded_total{endpoint}``: encoded images decoded by the model's preprocessing;
* ``sbcli_model_versions_loaded`` and ``sbcli_model_version_info{model,version,default}``;
* ``sbcli_requests_waiting``: requests waiting for the batcher (``--max-queue`` bounds it).

Beside them, the metrics a Triton dashboard reads, labelled ``model`` and ``version`` as Triton
labels them and read from the same counts as ``/v2/models/stats`` (:mod:`sbcli.serve.stats`):
``nv_inference_request_success``, ``nv_inference_request_failure`` (with ``reason``: REJECTED,
CANCELED, BACKEND, OTHER), ``nv_inference_count`` (images), ``nv_inference_exec_count`` (model
calls), ``nv_inference_request_duration_us``, ``nv_inference_queue_duration_us``,
``nv_inference_compute_input_duration_us``, ``nv_inference_compute_infer_duration_us``,
``nv_inference_compute_output_duration_us`` (counters) and ``nv_inference_pending_request_count``
(a gauge: requests waiting for the batcher). They are written as Triton writes them, counters
without prometheus_client's ``_total`` suffix, so that the names match a Triton dashboard's queries.

With ``--workers`` N each process counts its own requests; scrape each, or run one worker per
container as Kubernetes deployments usually do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sbcli.errors import ExportError
from sbcli.serve.limits import CLIENT_CLOSED
from sbcli.serve.stats import StatsBook, VersionStats

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TRITON_COUNTERS = (  # (name, help, what it reads of a VersionStats)
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.durations["success"].count),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)", lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds",
     lambda s: (s.durations["success"].ns + s.durations["fail"].ns) // 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     lambda s: s.durations["queue"].ns // 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     lambda s: s.durations["compute_input"].ns // 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     lambda s: s.durations["compute_infer"].ns // 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     lambda s: s.durations["compute_output"].ns // 1000),
)


def require_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as err:
        raise ExportError('`sb serve` reports metrics with prometheus_client; install the ONNX extra: '
                          'pip install "sbcli[onnx]" (or "sbcli[onnx-gpu]").') from err
    return prometheus_client


@dataclass
class Metrics:
    """The server's counters and histograms, in their own registry; ``versions()`` lists (model, version, default),
    ``book`` holds Triton's statistics, ``pending()`` the requests waiting by (model, version), ``waiting()`` all of them."""

    versions: Callable[[], list[tuple[str, int, bool]]]
    book: StatsBook = field(default_factory=StatsBook)
    pending: Callable[[], Mapping[Any, int]] = dict
    waiting: Callable[[], int] = int
    registry: Any = field(init=False)

    def __post_init__(self) -> None:
        prom = require_prometheus()
        self.registry = reg = prom.CollectorRegistry()
        self.requests = prom.Counter("sbcli_requests", "HTTP requests answered, by endpoint and status.",
                                     ["endpoint", "status"], registry=reg)
        self.failures = prom.Counter("sbcli_request_failures", "HTTP requests answered with a status of 400 or more.",
                                     ["endpoint", "status"], registry=reg)
        self.latency = prom.Histogram("sbcli_request_duration_seconds", "Time from request to response.",
                                      ["endpoint"], buckets=LATENCY_BUCKETS, registry=reg)
        self.queue = prom.Histogram("sbcli_queue_seconds", "Time an image waited for its batch.",
                                    buckets=LATENCY_BUCKETS, registry=reg)
        self.compute = prom.Histogram("sbcli_compute_seconds", "Time of one model call (one batch).",
                                      buckets=LATENCY_BUCKETS, registry=reg)
        self.batch = prom.Histogram("sbcli_batch_size", "Images scored in one model call.", buckets=BATCH_BUCKETS,
                                    registry=reg)
        self.decoded = prom.Counter("sbcli_images_decoded", "Encoded images decoded by the model's preprocessing.",
                                    ["endpoint"], registry=reg)
        reg.register(_VersionCollector(self.versions, self.waiting))

    def observe_batch(self, size: int, waits: list[float], compute_s: float) -> None:
        """One model call: its batch size, each image's wait in the queue, the call's duration."""
        self.batch.observe(size)
        self.compute.observe(compute_s)
        for wait in waits:
            self.queue.observe(wait)

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        if status >= 400 and status != CLIENT_CLOSED:
            self.failures.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def images_decoded(self, endpoint: str, count: int) -> None:
        self.decoded.labels(endpoint).inc(count)

    def render(self) -> tuple[bytes, str]:
        prom = require_prometheus()
        return prom.generate_latest(self.registry) + self.triton_text().encode(), prom.CONTENT_TYPE_LATEST

    def triton_text(self) -> str:
        """The ``nv_inference_*`` families in the text format, as Triton writes them, for every version served."""
        keys = [(model, version) for model, version, _ in self.versions()]
        pending = self.pending()
        lines: list[str] = []
        for name, doc, read in TRITON_COUNTERS:
            lines += _family(name, doc, "counter", [(_labels(k), read(self.book.entries.get(k) or _ZERO)) for k in keys])
        failures = [(_labels(k, reason=r), (self.book.entries.get(k) or _ZERO).failures[r]) for k in keys for r in REASONS]
        lines += _family("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
                         "counter", failures)
        lines += _family("nv_inference_pending_request_count", "Instantaneous number of pending requests awaiting "
                         "execution per-model.", "gauge", [(_labels(k), pending.get(k, 0)) for k in keys])
        return "".join(line + "\n" for line in lines)

    async def endpoint(self, _: Request) -> Response:
        body, kind = self.render()
        return Response(body, media_type=kind)


REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")  # sbcli.serve.stats.reason_of
_ZERO = VersionStats()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(key: tuple[str, int], **more: str) -> str:
    pairs = {"model": key[0], "version": str(key[1]), **more}
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items()) + "}"


def _family(name: str, doc: str, kind: str, samples: list[tuple[str, int]]) -> list[str]:
    return [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *(f"{name}{labels} {value}" for labels, value in samples)]


@dataclass(eq=False)  # registries keep collectors in a set: hashed by identity
class _VersionCollector:
    versions: Callable[[], list[tuple[str, int, bool]]]
    waiting: Callable[[], int] = int

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        listed = self.versions()
        count = GaugeMetricFamily("sbcli_model_versions_loaded", "Model versions loaded and served.")
        count.add_metric([], len(listed))
        info = GaugeMetricFamily("sbcli_model_version_info", "1 for each version served (default: the one served "
                                 "when a request names none).", labels=["model", "version", "default"])
        for model, version, default in listed:
            info.add_metric([model, str(version), str(default).lower()], 1)
        yield count
        yield info
        waiting = GaugeMetricFamily("sbcli_requests_waiting", "Requests waiting for the batcher (at most --max-queue).")
        waiting.add_metric([], self.waiting())
        yield waiting


def route_template(routes: list[Any], scope: Scope) -> str:
    """The path template of the route that ``scope`` matches (``other`` for none)."""
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return getattr(route, "path", "other")
    return "other"


@dataclass
class MetricsMiddleware:
    """Counts every HTTP request by its route and final status, and times it (a pure ASGI middleware)."""

    app: ASGIApp
    metrics: Metrics
    routes: list[Any]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.observe_request(route_template(self.routes, scope), status, time.perf_counter() - start)


class MetricsPortOnly:
    """ASGI middleware: on the metrics port (``--metrics-port``, Triton's 8002) only ``GET /metrics`` is answered,
    everything else is 404, so that a port opened for dashboards serves no model; the main port is unchanged."""

    def __init__(self, app: ASGIApp, port: int) -> None:
        self.app, self.port = app, port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        local = scope.get("server") or (None, None)
        if scope["type"] == "http" and local[1] == self.port and scope.get("path") != "/metrics":
            body = json.dumps({"error": f"Port {self.port} serves GET /metrics alone; send other requests to the "
                                        "server's main port."}).encode()
            await send({"type": "http.response.start", "status": 404,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
