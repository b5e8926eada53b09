"""The Open Inference Protocol (KServe v2 REST, as Triton speaks it) beside ``sb serve``'s own routes.

``GET /v2/health/live``, ``GET /v2/health/ready`` (every model loaded and warmed, and no reload
failing), ``GET /v2`` (server metadata), ``GET /v2/models/{name}[/versions/{version}]`` (model
metadata), ``GET .../ready``, ``POST .../infer``; Triton's extensions (the model list, configuration,
statistics and repository) are in :mod:`sbcli.serve.oip_triton`. Every model served has its name
(:mod:`sbcli.serve.served_models`); versions are learner steps (:mod:`sbcli.serve.versions`); the default
is the latest.

Inputs: ``images`` (``FP32`` [N, 3, S, S], preprocessed: RGB in [0, 1], resized to S; the
normalisation is inside the model) or ``image_bytes`` (``BYTES`` [N]: encoded images, decoded by
the model's own preprocessing). Outputs: ``logits`` (``FP32`` [N, C]) and ``probabilities`` (their
softmax, what ``sb predict`` reports), each also as a classification (:mod:`sbcli.serve.infer`).
Errors are ``{"error": "..."}`` with 400 (a malformed request), 404 (an unknown or unloaded model,
an unknown version, or route), 405 (a method a route does not take), 408 (the body did not arrive
in time), 413 (too large), 503 (not ready, the queue full, or the server's byte budget spent) or
500 (the model failed).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sbcli.serve import oip_codec as codec
from sbcli.serve.infer import BYTES_INPUT, OUTPUTS, TENSOR_INPUT, infer
from sbcli.serve.limits import HTTPError, read_body, refusal
from sbcli.serve.prometheus import Metrics
from sbcli.serve.classifier import OnnxClassifier
from sbcli.serve.oip_triton import PLATFORM, Extensions

logger = logging.getLogger(__name__)
SERVER_NAME = "sbcli"
EXTENSIONS = ["binary_tensor_data", "classification", "model_repository", "model_configuration", "statistics"]
INFER = "/v2/models/{name}/infer"


def _error(status: int, sentence: str) -> JSONResponse:
    return JSONResponse({"error": sentence}, status_code=status)


def model_metadata(name: str, versions: list[int], number: int, model: OnnxClassifier) -> dict[str, Any]:
    """The protocol's model metadata of version ``number`` (``versions``: all served, the latest the default)."""
    size, classes = model.image_size, len(model.class_names)
    return {
        "name": name,
        "versions": [str(v) for v in sorted(versions)],
        "platform": PLATFORM,
        "inputs": [{"name": TENSOR_INPUT, "datatype": "FP32", "shape": [-1, 3, size, size]},
                   {"name": BYTES_INPUT, "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": out, "datatype": "FP32", "shape": [-1, classes]} for out in OUTPUTS],
        "parameters": {"version": str(number), "default_version": str(max(versions)),
                       "labels": model.class_names, "provider": model.provider,
                       "preprocess": model.preprocess.to_json(), "send_one_of": [TENSOR_INPUT, BYTES_INPUT]},
    }


def server_metadata() -> dict[str, Any]:
    from sbcli import __version__

    return {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}


@dataclass
class Protocol:
    """The v2 routes over one server, its models and its metrics."""

    server: Any  # sbcli.serve.app.Server, which mounts this module (so not imported here)
    metrics: Metrics

    @property
    def ready(self) -> bool:
        return self.server.models.ready

    async def model(self, request: Request) -> tuple[Any, int, OnnxClassifier]:
        """(the served model, the version's number, its classifier) that the path names, a learner step not exported
        yet exported first. Raises HTTPError 404, 500 or 503."""
        return await self.server.models.resolve(request.path_params["name"], request.path_params.get("version"))

    async def live(self, _: Request) -> JSONResponse:
        return JSONResponse({"live": True})

    async def server_ready(self, _: Request) -> JSONResponse:
        return JSONResponse({"ready": self.ready}, status_code=200 if self.ready else 503)

    async def server_metadata(self, _: Request) -> JSONResponse:
        return JSONResponse(server_metadata())

    async def model_metadata(self, request: Request) -> JSONResponse:
        try:
            served, number, model = await self.model(request)
        except HTTPError as err:
            return _error(err.status, str(err))
        return JSONResponse(model_metadata(served.name, served.registry.numbers, number, model))

    async def model_ready(self, request: Request) -> JSONResponse:
        try:
            served, number, _ = await self.model(request)
        except HTTPError as err:
            return _error(err.status, str(err))
        return JSONResponse({"name": served.name, "version": str(number), "ready": served.ready},
                            status_code=200 if served.ready else 503)

    async def infer(self, request: Request) -> Response:
        cfg = self.server.cfg
        with self.server.inflight.lease() as lease:  # the body and the tensors parsed from it, held until the answer
            try:
                served, number, model = await self.model(request)

                async def parsed() -> codec.Request:
                    body = await read_body(request, cfg.max_request_bytes, lease, copies=2, timeout_s=cfg.request_timeout_s)
                    return codec.parse(body, request.headers.get(codec.HEADER))

                asked, answer = await infer(self.server, (served.name, number), model, parsed, INFER)
                content, headers, kind = self._answer(asked, served.name, number, answer)
            except HTTPError as err:
                return refusal(err)
            except Exception as err:  # the model itself failed: logged with its traceback, answered as a 500
                logger.exception("The model failed on an inference request")
                return _error(500, f"The model failed on this request ({type(err).__name__}); see the server log.")
        return Response(content, headers=headers, media_type=kind)

    @staticmethod
    def _answer(parsed: codec.Request, name: str, number: int, answer: list[tuple[codec.Wanted, np.ndarray]]) -> tuple[bytes, dict, str]:
        outs, parts = [], []
        for want, tensor in answer:
            out, raw = codec.output(want.name, tensor, want.binary)
            outs.append(out)
            parts.append(raw)
        header: dict[str, Any] = {"model_name": name, "model_version": str(number), "outputs": outs}
        if parsed.id is not None:
            header["id"] = parsed.id
        return codec.response(header, parts)

    def routes(self) -> list[Route]:
        models, versioned = "/v2/models/{name}", "/v2/models/{name}/versions/{version}"
        return [
            Route("/v2/health/live", self.live, methods=["GET"]),
            Route("/v2/health/ready", self.server_ready, methods=["GET"]),
            Route("/v2", self.server_metadata, methods=["GET"]),
            *Extensions(self.server).routes(),  # before {name}: /v2/models/stats is not a model
            Route(models, self.model_metadata, methods=["GET"]),
            Route(versioned, self.model_metadata, methods=["GET"]),
            Route(f"{models}/ready", self.model_ready, methods=["GET"]),
            Route(f"{versioned}/ready", self.model_ready, methods=["GET"]),
            Route(INFER, self.infer, methods=["POST"]),
            Route(f"{versioned}/infer", self.infer, methods=["POST"]),
            Route("/metrics", self.metrics.endpoint, methods=["GET"]),
        ]


@dataclass
class Mounted:
    """What :func:`mount` adds to an app: routes, the metrics middleware's state, the task that lists versions."""

    protocol: Protocol
    routes: list[Route]

    @property
    def metrics(self) -> Metrics:
        return self.protocol.metrics

    def follow(self) -> asyncio.Task:
        """Start listing versions (the first listing warms every model); call inside the event loop."""
        server = self.protocol.server
        interval = min(server.cfg.reload_interval_s or 0.5, 0.5)
        return asyncio.get_running_loop().create_task(server.models.follow(interval))


def mount(server: Any) -> Mounted:
    """The protocol's routes and ``/metrics`` over ``server``; its batcher reports to the metrics and the statistics."""
    metrics = Metrics(versions=server.models.versions, book=server.stats, pending=lambda: server.batcher.pending,
                      waiting=lambda: server.batcher.waiting)

    def observe(key: Any, size: int, waits: list[float], seconds: float) -> None:
        metrics.observe_batch(size, waits, seconds)
        server.stats.executed(key, size, waits, seconds)

    server.batcher.observer = observe
    protocol = Protocol(server, metrics)
    return Mounted(protocol, protocol.routes())
