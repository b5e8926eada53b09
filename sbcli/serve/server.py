"""Start ``sb serve``: check and load the models once, then uvicorn (one process, or ``--workers`` N
processes sharing the port, each with its own models, batcher and reload watcher), and with
``--grpc-port`` the gRPC protocol in the same event loop (each worker on the same port: gRPC sets
SO_REUSEPORT, so the kernel spreads connections over the workers).

Stack: Starlette (routing, multipart via python-multipart) on uvicorn (the ASGI server). Both are
small, pure-Python, widely used and maintained; uvicorn's ``workers`` gives several processes on
one port without a separate process manager. uvicorn runs with :class:`sbcli.serve.guard.GuardedProtocol`
(deadlines and a connection limit) and with sbcli's log lines as plain lines beside its own.

Every option is checked before the model loads, each refusal one sentence naming the option:
numbers finite and in range, threads and workers at most the CPU cores, the addresses ones this
process can listen on, the models' names distinct, and grpcio installed when gRPC is asked for.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import socket
from dataclasses import dataclass
from typing import Any

from PIL import Image

from sbcli.data.pixels import DEFAULT_MAX_PIXELS
from sbcli.errors import ConfigError, ExportError
from sbcli.serve.app import CONFIG_ENV, CONTROL_MODES, ServeConfig, Server, create_app
from sbcli.serve.batching import BatchConfig
from sbcli.serve.providers import CHOICES
from sbcli.text import printable

MIB = 2**20
DEBUG_ENV = "SBCLI_DEBUG"  # set: sbcli's debug lines (what a start does, and when) reach the log
MAX_REQUEST_MB = 1024.0  # a request is held whole in memory
MAX_INFLIGHT_MB = 65536.0
MAX_MEGAPIXELS = 1e6  # a bound on either pixel limit (a million megapixels would need about 4 TB to decode)
MAX_WAIT_MS = 60_000.0  # a longer wait to fill a batch only delays every answer
MAX_RELOAD_INTERVAL_S = 86_400.0
MIN_REQUEST_TIMEOUT_S, MAX_REQUEST_TIMEOUT_S = 0.01, 3600.0
MAX_QUEUE = 1_000_000  # requests waiting at once; each holds its decoded images, so far fewer fit in memory

SERVER_HINT = 'install the ONNX extra, which holds the server: pip install "sbcli[onnx]" (or "sbcli[onnx-gpu]")'
GRPC_HINT = 'install the gRPC extra: pip install "sbcli[grpc]" (grpcio and the protocol\'s messages from tritonclient)'


@dataclass(frozen=True)
class Listen:
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    log_level: str = "warning"
    grpc_port: int | None = None  # the gRPC protocol's port (None: HTTP only)

    @property
    def grpc_listen(self) -> str | None:
        """``host:port`` for grpcio (an IPv6 host in brackets), or None."""
        if self.grpc_port is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.grpc_port}"


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def finite(flag: str, value: float) -> float:
    """``value``, refused (ConfigError naming ``flag``) when it is NaN or infinite."""
    if not math.isfinite(value):
        raise ConfigError(f"{flag} must be a finite number, not {value}.")
    return value


def scaled(flag: str, value: float, unit: float, high: float) -> int:
    """``value`` times ``unit`` as a whole number, refused (ConfigError naming ``flag``) unless it is above 0 and at
    most ``high``: checked before the product, which NaN, infinity or 1e308 would make no whole number at all."""
    if not 0 < finite(flag, value) <= high:
        raise ConfigError(f"{flag} must be above 0 and at most {high:g}, not {value:g}.")
    return round(value * unit)


def megabytes(flag: str, value: float, high: float = MAX_INFLIGHT_MB) -> int:
    """``value`` MiB as bytes (the finer range of each option is checked with the others, :func:`check_bytes`)."""
    return scaled(flag, value, MIB, high)


def megapixels(flag: str, value: float) -> int:
    """``value`` megapixels as pixels (Pillow's threshold and their order are checked later, :func:`check_pixels`)."""
    return scaled(flag, value, 1e6, MAX_MEGAPIXELS)


def within(flag: str, value: float, low: float, high: float | None = None) -> None:
    """Refuse ``value`` outside [low, high] in one sentence naming ``flag`` (NaN is never within)."""
    if not (low <= value and (high is None or value <= high)):
        bounds = f"at least {low:g}" if high is None else f"between {low:g} and {high:g}"
        raise ConfigError(f"{flag} must be {bounds}, not {value:g}.")


def at_most_cores(flag: str, value: int, cores: int, why: str) -> None:
    if value > cores:
        raise ConfigError(f"{flag} must be at most {cores}, the CPU cores this machine has ({why}), not {value}.")


def check(cfg: ServeConfig, listen: Listen) -> None:
    """Refuse bad options before anything loads (one sentence each, naming the option)."""
    if cfg.provider not in CHOICES:
        raise ConfigError(f"--provider {cfg.provider} is unknown; choose one of: {', '.join(CHOICES)}.")
    if cfg.model_control_mode not in CONTROL_MODES:
        raise ConfigError(f"--model-control-mode {cfg.model_control_mode} is unknown; choose one of: "
                          f"{', '.join(CONTROL_MODES)}.")
    if cfg.gpu() is not None:
        cfg.gpu().check(cfg.provider)
    check_processes(cfg, listen)
    check_grpc(listen)
    check_metrics_port(cfg, listen)
    check_batching(cfg)
    check_bytes(cfg)
    check_pixels(cfg.max_image_pixels, cfg.max_request_pixels)
    check_connections(cfg)


def check_processes(cfg: ServeConfig, listen: Listen) -> None:
    """Port, workers and threads: more workers or threads than cores only wait for each other."""
    cores = cpu_cores()
    within("--port", listen.port, 0, 65535)
    within("--workers", listen.workers, 1)
    at_most_cores("--workers", listen.workers, cores, "each worker's model calls already use every core")
    if cfg.threads is not None:
        within("--threads", cfg.threads, 1)
        at_most_cores("--threads", cfg.threads, cores, "more onnxruntime threads than cores only wait for each other")


def check_grpc(listen: Listen) -> None:
    """A gRPC port in range and not the HTTP one, and grpcio with the protocol's messages installed."""
    if listen.grpc_port is None:
        return
    within("--grpc-port", listen.grpc_port, 1, 65535)
    if listen.grpc_port == listen.port:
        raise ConfigError(f"--grpc-port must differ from --port ({listen.port}): each protocol needs its own port.")
    try:
        import grpc  # noqa: F401
        from tritonclient.grpc import service_pb2  # noqa: F401
    except ImportError as err:
        raise ExportError(f"--grpc-port needs grpcio; {GRPC_HINT}.") from err


def check_metrics_port(cfg: ServeConfig, listen: Listen) -> None:
    """0 (off) or a port of its own, neither the HTTP nor the gRPC one."""
    within("--metrics-port", cfg.metrics_port, 0, 65535)
    taken = {listen.port: "--port", listen.grpc_port: "--grpc-port"}
    if cfg.metrics_port and cfg.metrics_port in taken:
        raise ConfigError(f"--metrics-port must differ from {taken[cfg.metrics_port]} ({cfg.metrics_port}), or be 0 "
                          "(off): each listener needs its own port.")


def check_batching(cfg: ServeConfig) -> None:
    within("--top-k", cfg.top_k, 1)
    within("--max-images", cfg.max_images, 1)
    within("--max-batch-size", cfg.max_batch_size, 1)
    within("--max-wait-ms", cfg.max_wait_ms, 0, MAX_WAIT_MS)
    within("--max-queue", cfg.max_queue, 1, MAX_QUEUE)
    within("--reload-interval", cfg.reload_interval_s, 0, MAX_RELOAD_INTERVAL_S)
    BatchConfig(cfg.max_batch_size, cfg.max_wait_ms, cfg.max_queue)


def check_bytes(cfg: ServeConfig) -> None:
    """A request's bytes, the bytes of all of them at once (at least one request of the largest size) and their deadline."""
    request_mb = cfg.max_request_bytes / MIB
    within("--max-request-mb", request_mb, 0.001, MAX_REQUEST_MB)
    if cfg.inflight_bytes < cfg.max_request_bytes:
        raise ConfigError(f"--max-inflight-mb must be at least --max-request-mb ({request_mb:g}), so that one request of "
                          f"the largest size fits, not {cfg.inflight_bytes / MIB:g}.")
    within("--max-inflight-mb", cfg.inflight_bytes / MIB, request_mb, MAX_INFLIGHT_MB)
    within("--request-timeout", cfg.request_timeout_s, MIN_REQUEST_TIMEOUT_S, MAX_REQUEST_TIMEOUT_S)
    within("--header-timeout", cfg.header_timeout_s, MIN_REQUEST_TIMEOUT_S, MAX_REQUEST_TIMEOUT_S)


def check_connections(cfg: ServeConfig) -> None:
    """At least 1, and within the open-file limit less what the process keeps for its model, log and accept backlog."""
    from sbcli.serve.guard import connection_limit, open_file_limit

    within("--max-connections", cfg.connections, 1)
    if cfg.max_connections_per_client is not None:
        within("--max-connections-per-client", cfg.max_connections_per_client, 1)
    room = connection_limit()
    if room is not None and cfg.connections > room:
        raise ConfigError(f"--max-connections must be at most {room}, what this process's limit of {open_file_limit()} "
                          f"open files leaves beside its model, log and accept backlog (raise it with ulimit -n), "
                          f"not {cfg.connections}.")


def check_address(listen: Listen, metrics_port: int = 0) -> None:
    """Refuse a --host that does not resolve, or an address and port (HTTP, gRPC, metrics) this process cannot listen on.

    It binds the way uvicorn will (SO_REUSEADDR, so a port in TIME_WAIT is free), and lets go: a
    mistyped host or a port in use is one sentence before the model loads, not uvicorn's message after.
    """
    for port, flag in ((listen.port, "--port"), (listen.grpc_port, "--grpc-port"), (metrics_port or None, "--metrics-port")):
        if port is not None:
            probe_address(listen.host, port, flag)


def probe_address(host: str, port: int, flag: str) -> None:
    listen = Listen(host, port)
    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    try:
        socket.getaddrinfo(listen.host, listen.port, family, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise ConfigError(f"--host {listen.host} is not an address this machine can resolve "
                          f"({getattr(err, 'strerror', None) or err}); give an IP address such as 127.0.0.1 or 0.0.0.0, "
                          "or a host name.") from err
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((listen.host, listen.port))
        except OSError as err:
            raise ConfigError(f"Cannot listen on {listen.host}:{listen.port} ({err.strerror or err}); "
                              f"choose another --host or {flag}.") from err


def check_pixels(image: int, request: int) -> None:
    """Refuse pixel limits that are not positive, not ordered, or above Pillow's decompression-bomb threshold."""
    bomb = Image.MAX_IMAGE_PIXELS or DEFAULT_MAX_PIXELS
    if not 1 <= image <= request:
        raise ConfigError("--max-image-megapixels must be above 0 and at most --max-request-megapixels.")
    if image > bomb:
        raise ConfigError(f"--max-image-megapixels must be at most {bomb / 1e6:g} (Pillow's decompression-bomb threshold, "
                          "which the server enforces too).")


def prepare(cfg: ServeConfig, listen: Listen) -> Server:
    """Check the options and load the models (exporting learners to the cache): errors before binding."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise ExportError(f"`sb serve` needs Starlette and uvicorn; {SERVER_HINT}.") from err
    check(cfg, listen)
    check_address(listen, cfg.metrics_port)
    server = Server(cfg)
    server.load()
    return server


def log_config() -> dict[str, Any]:
    """uvicorn's logging, with sbcli's lines (reloads, refusals, failures) as plain lines beside uvicorn's.

    Without it, sbcli's lines went through the command line's rich handler, which pads every line
    to its console's width: 100,000 columns when stderr is not a terminal, so a reload line was
    100 KB; and a ``--workers`` process had no handler at all. uvicorn applies this dictionary in
    every process it starts.
    """
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["sbcli"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    if os.environ.get(DEBUG_ENV) == "1":  # each step of a start, stamped with the milliseconds since the process began
        config["formatters"]["timed"] = {**config["formatters"]["default"],
                                         "fmt": "%(levelprefix)s +%(relativeCreated).0f ms %(message)s"}
        config["handlers"]["timed"] = {**config["handlers"]["default"], "formatter": "timed"}
        config["loggers"]["sbcli"] = {"handlers": ["timed"], "level": "DEBUG", "propagate": False}
    config.setdefault("filters", {})["printable"] = {"()": f"{__name__}.PrintableLog"}
    for handler in config["handlers"].values():
        handler.setdefault("filters", []).append("printable")
    return config


class PrintableLog(logging.Filter):
    """A log line's user text (paths, model names, a request's path) with its control characters shown as escapes,
    so that a name cannot drive the terminal the log is read on (:func:`sbcli.text.printable`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = printable(record.msg)
        if isinstance(record.args, tuple):  # uvicorn's access lines read their fields from the arguments
            record.args = tuple(a if isinstance(a, int | float) else printable(a) for a in record.args)
        return True


def uvicorn_options(listen: Listen, cfg: ServeConfig) -> dict[str, Any]:
    """What uvicorn runs with: the guarded HTTP protocol and a backlog that fits beside its connections, the
    address and the logging."""
    from sbcli.serve.guard import GuardedProtocol, accept_backlog

    return {"host": listen.host, "port": listen.port, "log_level": listen.log_level, "log_config": log_config(),
            "http": GuardedProtocol, "backlog": accept_backlog(cfg.connections)}


def run(server: Server, listen: Listen) -> None:
    """Serve until interrupted."""
    import uvicorn

    options = uvicorn_options(listen, server.cfg)
    if server.cfg.grpc_listen:
        options["loop"] = "asyncio"  # grpc.aio shares uvicorn's loop: the standard one, whatever uvloop is installed
    if listen.workers > 1:
        os.environ[CONFIG_ENV] = server.cfg.to_env()  # each worker process builds its app from it
        app: Any = "sbcli.serve.app:app_from_env"
        options.update(factory=True, workers=listen.workers)
    else:
        app = create_app(server)
    if not server.cfg.metrics_port:
        uvicorn.run(app, **options)
        return
    run_with_metrics_port(uvicorn.Config(app, **options), server.cfg.metrics_port)


def run_with_metrics_port(config: Any, metrics_port: int) -> None:
    """uvicorn on two listening sockets, the main port and the metrics port, as uvicorn serves the sockets it is
    handed (each --workers process accepts on both); the app answers only GET /metrics on the metrics port
    (:class:`sbcli.serve.prometheus.MetricsPortOnly`)."""
    import inspect

    import uvicorn
    from uvicorn.supervisors import Multiprocess

    sockets = [config.bind_socket(), uvicorn.Config(config.app, host=config.host, port=metrics_port).bind_socket()]
    server = uvicorn.Server(config)
    try:
        if config.workers > 1:
            target = {"target": server.run} if "target" in inspect.signature(Multiprocess).parameters else {}
            Multiprocess(config, sockets=sockets, **target).run()  # uvicorn < 0.36 names the worker's target
        else:
            server.run(sockets=sockets)
    except KeyboardInterrupt:
        pass
    finally:
        for sock in sockets:
            sock.close()


def describe(server: Server) -> dict[str, Any]:
    """What the CLI prints before serving."""
    return server.metadata()
