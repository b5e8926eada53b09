"""Start ``sb serve``: check and load the model once, then uvicorn (one process, or ``--workers`` N
processes sharing the port, each with its own model, batcher and reload watcher).

Stack: Starlette (routing, multipart via python-multipart) on uvicorn (the ASGI server). Both are
small, pure-Python, widely used and maintained; uvicorn's ``workers`` gives several processes on
one port without a separate process manager.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from PIL import Image

from sbcli.data.pixels import DEFAULT_MAX_PIXELS
from sbcli.errors import ConfigError, ExportError
from sbcli.serve.app import CONFIG_ENV, ServeConfig, Server, create_app
from sbcli.serve.batching import BatchConfig
from sbcli.serve.providers import CHOICES

SERVER_HINT = 'install the ONNX extra, which holds the server: pip install "sbcli[onnx]" (or "sbcli[onnx-gpu]")'


@dataclass(frozen=True)
class Listen:
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    log_level: str = "warning"


def check(cfg: ServeConfig, listen: Listen) -> None:
    """Refuse bad options before anything loads (one sentence each)."""
    BatchConfig(cfg.max_batch_size, cfg.max_wait_ms)
    if cfg.provider not in CHOICES:
        raise ConfigError(f"--provider {cfg.provider} is unknown; choose one of: {', '.join(CHOICES)}.")
    if cfg.gpu() is not None:
        cfg.gpu().check(cfg.provider)
    if listen.workers < 1 or not 0 <= listen.port <= 65535:
        raise ConfigError("--workers must be at least 1 and --port between 0 and 65535.")
    if cfg.top_k < 1 or cfg.max_images < 1 or cfg.max_request_bytes < 1024 or cfg.reload_interval_s < 0:
        raise ConfigError("--top-k and --max-images must be at least 1, --max-request-mb at least 0.001 and --reload-interval at least 0.")
    check_pixels(cfg.max_image_pixels, cfg.max_request_pixels)


def check_pixels(image: int, request: int) -> None:
    """Refuse pixel limits that are not positive, not ordered, or above Pillow's decompression-bomb threshold."""
    bomb = Image.MAX_IMAGE_PIXELS or DEFAULT_MAX_PIXELS
    if not 1 <= image <= request:
        raise ConfigError("--max-image-megapixels must be above 0 and at most --max-request-megapixels.")
    if image > bomb:
        raise ConfigError(f"--max-image-megapixels must be at most {bomb / 1e6:g} (Pillow's decompression-bomb threshold, "
                          "which the server enforces too).")


def prepare(cfg: ServeConfig, listen: Listen) -> Server:
    """Check the options and load the model (exporting a learner to the cache): errors before binding."""
    check(cfg, listen)
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise ExportError(f"`sb serve` needs Starlette and uvicorn; {SERVER_HINT}.") from err
    server = Server(cfg)
    server.load()
    return server


def run(server: Server, listen: Listen) -> None:
    """Serve until interrupted."""
    import uvicorn

    if listen.workers == 1:
        uvicorn.run(create_app(server), host=listen.host, port=listen.port, log_level=listen.log_level)
        return
    os.environ[CONFIG_ENV] = server.cfg.to_env()  # each worker process builds its app from it
    uvicorn.run("sbcli.serve.app:app_from_env", factory=True, host=listen.host, port=listen.port,
                workers=listen.workers, log_level=listen.log_level)


def describe(server: Server) -> dict[str, Any]:
    """What the CLI prints before serving."""
    return server.metadata()
