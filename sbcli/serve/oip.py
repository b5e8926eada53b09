"""The Open Inference Protocol (KServe v2 REST, as Triton speaks it) beside ``sb serve``'s own routes.

``GET /v2/health/live``, ``GET /v2/health/ready`` (the model loaded and warmed, and no reload
failing), ``GET /v2`` (server metadata), ``GET /v2/models/{name}[/versions/{version}]`` (model
metadata), ``GET .../ready``, ``POST .../infer``. Versions are learner steps
(:mod:`sbcli.serve.versions`); the default is the latest.

Inputs: ``images`` (``FP32`` [N, 3, S, S], preprocessed: RGB in [0, 1], resized to S; the
normalisation is inside the model) or ``image_bytes`` (``BYTES`` [N]: encoded images, decoded by
the model's own preprocessing). Outputs: ``logits`` (``FP32`` [N, C]) and ``probabilities`` (their
softmax, what ``sb predict`` reports), each also as a classification. Errors are ``{"error": "..."}``
with 400 (a malformed request), 404 (an unknown model or version, or route), 405 (a method a route
does not take), 408 (the body did not arrive in time), 413 (too large), 503 (not ready, or the
server's byte budget spent) or 500 (the model failed).
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

from sbcli.errors import SbcliError
from sbcli.serve import oip_codec as codec
from sbcli.serve.limits import HTTPError, decode_within, read_body, refusal
from sbcli.serve.metrics import Metrics
from sbcli.serve.model import OnnxClassifier
from sbcli.serve.predict import softmax
from sbcli.serve.versions import Registry

logger = logging.getLogger(__name__)
SERVER_NAME = "sbcli"
EXTENSIONS = ["binary_tensor_data", "classification"]
TENSOR_INPUT, BYTES_INPUT = "images", "image_bytes"
OUTPUTS = ("logits", "probabilities")
INFER = "/v2/models/{name}/infer"


def _error(status: int, sentence: str) -> JSONResponse:
    return JSONResponse({"error": sentence}, status_code=status)


@dataclass
class Protocol:
    """The v2 routes over one server, its versions and its metrics."""

    server: Any  # sbcli.serve.app.Server, which mounts this module (so not imported here)
    registry: Registry
    metrics: Metrics

    @property
    def ready(self) -> bool:
        return (self.server.loaded is not None and self.registry.ready
                and getattr(self.server, "failing", None) is None)

    def model(self, request: Request) -> tuple[int, OnnxClassifier]:
        name, version = request.path_params["name"], request.path_params.get("version")
        if name != self.registry.name:
            raise HTTPError(404, f"Model {name!r} is not served here; this server serves {self.registry.name!r}.")
        if not self.registry.versions:
            raise HTTPError(503, "The model is still loading; retry when /v2/health/ready answers 200.")
        try:
            return self.registry.get(version)
        except KeyError as err:
            raise HTTPError(404, f"Model {name!r} {err.args[0]}.") from err

    async def live(self, _: Request) -> JSONResponse:
        return JSONResponse({"live": True})

    async def server_ready(self, _: Request) -> JSONResponse:
        return JSONResponse({"ready": self.ready}, status_code=200 if self.ready else 503)

    async def server_metadata(self, _: Request) -> JSONResponse:
        from sbcli import __version__

        return JSONResponse({"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS})

    async def model_metadata(self, request: Request) -> JSONResponse:
        try:
            number, model = self.model(request)
        except HTTPError as err:
            return _error(err.status, str(err))
        size, classes = model.image_size, len(model.class_names)
        return JSONResponse({
            "name": self.registry.name,
            "versions": [str(v) for v in sorted(self.registry.versions)],
            "platform": "onnxruntime_onnx",
            "inputs": [{"name": TENSOR_INPUT, "datatype": "FP32", "shape": [-1, 3, size, size]},
                       {"name": BYTES_INPUT, "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": name, "datatype": "FP32", "shape": [-1, classes]} for name in OUTPUTS],
            "parameters": {"version": str(number), "default_version": str(self.registry.latest),
                           "labels": model.class_names, "provider": model.provider,
                           "preprocess": model.preprocess.to_json(), "send_one_of": [TENSOR_INPUT, BYTES_INPUT]},
        })

    async def model_ready(self, request: Request) -> JSONResponse:
        try:
            number, _ = self.model(request)
        except HTTPError as err:
            return _error(err.status, str(err))
        ready = self.ready
        return JSONResponse({"name": self.registry.name, "version": str(number), "ready": ready},
                            status_code=200 if ready else 503)

    async def infer(self, request: Request) -> Response:
        cfg = self.server.cfg
        with self.server.inflight.lease() as lease:  # the body and the tensors parsed from it, held until the answer
            try:
                number, model = self.model(request)
                body = await read_body(request, cfg.max_request_bytes, lease, copies=2, timeout_s=cfg.request_timeout_s)
                parsed = codec.parse(body, request.headers.get(codec.HEADER))
                images = await self._inputs(parsed, model)
                scores = np.stack(await asyncio.gather(*(self.server.batcher.submit(model, x) for x in images)))
                content, headers, kind = self._answer(parsed, model, number, scores)
            except HTTPError as err:
                return refusal(err)
            except Exception as err:  # the model itself failed: logged with its traceback, answered as a 500
                logger.exception("The model failed on an inference request")
                return _error(500, f"The model failed on this request ({type(err).__name__}); see the server log.")
        return Response(content, headers=headers, media_type=kind)

    async def _inputs(self, parsed: codec.Request, model: OnnxClassifier) -> np.ndarray:
        if len(parsed.inputs) != 1 or parsed.inputs[0].name not in (TENSOR_INPUT, BYTES_INPUT):
            raise HTTPError(400, f'Send one input: "{TENSOR_INPUT}" (FP32 [N, 3, H, W]) or "{BYTES_INPUT}" (BYTES [N] encoded images).')
        tensor, size, limit = parsed.inputs[0], model.image_size, self.server.cfg.max_images
        wanted = "FP32" if tensor.name == TENSOR_INPUT else "BYTES"
        if tensor.datatype != wanted:
            raise HTTPError(400, f'Input "{tensor.name}" must have datatype {wanted}, not {tensor.datatype}.')
        n = tensor.shape[0]
        if n > limit:
            raise HTTPError(413, f"The request holds {n} images, more than the {limit} this server accepts.")
        if n < 1:
            raise HTTPError(400, "The request holds no image.")
        if wanted == "FP32":
            if tensor.shape != [n, 3, size, size]:
                raise HTTPError(400, f'Input "{TENSOR_INPUT}" must have shape [N, 3, {size}, {size}], not {tensor.shape}.')
            return np.ascontiguousarray(tensor.data, dtype=np.float32)
        if len(tensor.shape) != 1:
            raise HTTPError(400, f'Input "{BYTES_INPUT}" must have shape [N]: one encoded image per element.')
        images = [(f"#{i}", bytes(data)) for i, data in enumerate(tensor.data)]
        decoded = await decode_within(model.preprocess, images, self.server.cfg.request_limits, self.server.budget)
        self.metrics.images_decoded(INFER, len(decoded))
        return model.preprocess.to_input(list(decoded))

    def _answer(self, parsed: codec.Request, model: OnnxClassifier, number: int, scores: np.ndarray) -> tuple[bytes, dict, str]:
        values = {"logits": scores.astype(np.float32), "probabilities": softmax(scores.astype(np.float64)).astype(np.float32)}
        wanted = parsed.outputs or [codec.Wanted(name, parsed.binary_default) for name in OUTPUTS]
        outs, parts = [], []
        for want in wanted:
            if want.name not in values:
                raise HTTPError(400, f"Output {want.name!r} is not an output of this model; ask for {' or '.join(OUTPUTS)}.")
            k = want.classification or parsed.classification
            tensor = codec.classify(values[want.name], k, model.class_names) if k else values[want.name]
            out, raw = codec.output(want.name, tensor, want.binary)
            outs.append(out)
            parts.append(raw)
        header: dict[str, Any] = {"model_name": self.registry.name, "model_version": str(number), "outputs": outs}
        if parsed.id is not None:
            header["id"] = parsed.id
        return codec.response(header, parts)

    def routes(self) -> list[Route]:
        models, versioned = "/v2/models/{name}", "/v2/models/{name}/versions/{version}"
        return [
            Route("/v2/health/live", self.live, methods=["GET"]),
            Route("/v2/health/ready", self.server_ready, methods=["GET"]),
            Route("/v2", self.server_metadata, methods=["GET"]),
            Route(models, self.model_metadata, methods=["GET"]),
            Route(versioned, self.model_metadata, methods=["GET"]),
            Route(f"{models}/ready", self.model_ready, methods=["GET"]),
            Route(f"{versioned}/ready", self.model_ready, methods=["GET"]),
            Route(INFER, self.infer, methods=["POST"]),
            Route(f"{versioned}/infer", self.infer, methods=["POST"]),
            Route("/metrics", self.metrics.endpoint, methods=["GET"]),
        ]

    def versions(self) -> list[tuple[str, int, bool]]:
        """(model, version, default) of every version served (for the metrics)."""
        listed = dict(self.registry.versions)
        top = max(listed) if listed else None
        return [(self.registry.name, n, n == top) for n in sorted(listed)]

    async def keep_synced(self, interval_s: float) -> None:
        """Follow the server's reloads: list the new step's version (and any other new kept step)."""
        loop = asyncio.get_running_loop()
        while True:
            loaded = self.server.loaded
            if loaded is not None and loaded is not self.registry.synced:
                try:
                    await loop.run_in_executor(None, self.registry.sync, loaded)
                    self.registry.failing = None
                except SbcliError as err:
                    logger.warning("Kept the versions served: %s could not be listed in full (%s)", self.registry.source, err)
                    self.registry.failing = str(err)
                    self.registry.synced = loaded  # tried once; the next reload tries again
            await asyncio.sleep(interval_s)


@dataclass
class Mounted:
    """What :func:`mount` adds to an app: routes, the metrics middleware's state, the task that follows reloads."""

    protocol: Protocol
    routes: list[Route]

    @property
    def metrics(self) -> Metrics:
        return self.protocol.metrics

    def follow(self) -> asyncio.Task:
        """Start listing versions (the first listing warms every model); call inside the event loop."""
        interval = self.protocol.server.cfg.reload_interval_s or 0.5
        return asyncio.get_running_loop().create_task(self.protocol.keep_synced(min(interval, 0.5)))


def mount(server: Any) -> Mounted:
    """The protocol's routes and ``/metrics`` over ``server``; its batcher reports to the metrics."""
    cfg = server.cfg
    registry = Registry(server.source, cfg.provider, cfg.threads, cfg.gpu(), cfg.exporter)
    holder: list[Protocol] = []
    metrics = Metrics(versions=lambda: holder[0].versions() if holder else [])
    protocol = Protocol(server, registry, metrics)
    holder.append(protocol)
    server.batcher.observer = metrics.observe_batch
    return Mounted(protocol, protocol.routes())
