"""Triton's extensions of the v2 protocol, so that a Triton client and dashboard work unchanged.

* ``GET /v2/models``: every model served, with its versions and state (sbcli's; Triton has no such route);
* ``GET /v2/models/{name}[/versions/{version}]/config``: the model configuration, as Triton's JSON
  (what ``tritonclient``'s ``get_model_config`` returns): the interface ``sb serve`` offers for
  the model (inputs ``images`` or ``image_bytes``, outputs ``logits`` and ``probabilities``), its
  batching and queue;
* ``GET /v2/models/stats``, ``GET /v2/models/{name}[/versions/{version}]/stats``: Triton's
  statistics (:mod:`sbcli.serve.stats`);
* ``POST /v2/repository/index`` (``{"ready": true}``: only the ready ones),
  ``POST /v2/repository/models/{name}/load`` and ``.../unload``: Triton's explicit model control
  (:class:`sbcli.serve.served_models.Models`). A load request naming a ``config`` or ``files`` is refused:
  a model is always loaded from its source. With ``--workers`` N, each process loads and unloads
  its own models: control them with one worker per container.

The gRPC service answers the same dictionaries, converted to its messages (:mod:`sbcli.serve.grpc_service`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sbcli.serve.infer import BYTES_INPUT, OUTPUTS, TENSOR_INPUT
from sbcli.serve.limits import HTTPError, parse_json, read_body, refusal
from sbcli.serve.classifier import OnnxClassifier

PLATFORM, BACKEND = "onnxruntime_onnx", "onnxruntime"
MAX_CONTROL_BYTES = 64 * 2**10  # a repository request is a small JSON object


def model_config(name: str, model: OnnxClassifier, cfg: Any) -> dict[str, Any]:
    """Triton's configuration (its JSON form) of ``model`` as served as ``name`` under ``cfg`` (a ServeConfig).

    ``max_batch_size`` is the most images one request may hold (``--max-images``); the dynamic
    batcher prefers ``--max-batch-size`` images per model call, waits at most ``--max-wait-ms`` and
    queues at most ``--max-queue`` requests, refusing past it. Each input is optional: send one.
    """
    size, classes = model.image_size, len(model.class_names)
    kind = "KIND_CPU" if model.provider.startswith("cpu") else "KIND_GPU"
    return {
        "name": name, "platform": PLATFORM, "backend": BACKEND, "version_policy": {"all": {}},
        "max_batch_size": cfg.max_images,
        "input": [{"name": TENSOR_INPUT, "data_type": "TYPE_FP32", "format": "FORMAT_NCHW", "dims": [3, size, size],
                   "optional": True},
                  {"name": BYTES_INPUT, "data_type": "TYPE_STRING", "format": "FORMAT_NONE", "dims": [1],
                   "reshape": {"shape": []}, "optional": True}],
        "output": [{"name": out, "data_type": "TYPE_FP32", "dims": [classes]} for out in OUTPUTS],
        "dynamic_batching": {"preferred_batch_size": [cfg.max_batch_size],
                             "max_queue_delay_microseconds": round(cfg.max_wait_ms * 1000),
                             "default_queue_policy": {"timeout_action": "REJECT", "default_timeout_microseconds": 0,
                                                      "allow_timeout_override": False, "max_queue_size": cfg.max_queue}},
        "instance_group": [{"name": name, "kind": kind, "count": 1}],
        "default_model_filename": "model.onnx",
    }


@dataclass
class Extensions:
    """The routes over one server (sbcli.serve.app.Server)."""

    server: Any

    def config(self, name: str, version: str | None) -> dict[str, Any]:
        """The configuration of that version (default: the latest). Raises HTTPError 404 or 503."""
        served, _, model = self.server.models.lookup(name, version)
        return model_config(served.name, model, self.server.cfg)

    def statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        """Triton's statistics of one version, every version of one model, or (no name) every model served."""
        models = self.server.models
        if not name:
            keys = [(n, v) for n, v, _ in models.versions()]
        elif version:
            served, number, _ = models.lookup(name, version)
            keys = [(served.name, number)]
        else:
            served = models.find(name)
            keys = [(served.name, v) for v in sorted(served.registry.versions)]
        return self.server.stats.to_json(keys)

    async def body(self, request: Request) -> dict[str, Any]:
        """The JSON object of a repository request (none: ``{}``). Raises HTTPError 400, 408, 413."""
        with self.server.inflight.lease() as lease:
            raw = await read_body(request, MAX_CONTROL_BYTES, lease, timeout_s=self.server.cfg.request_timeout_s)
        data = parse_json(raw) if raw.strip() else {}
        if not isinstance(data, dict):
            raise HTTPError(400, "The request body must be a JSON object.")
        return data

    async def list_models(self, _: Request) -> JSONResponse:
        models = self.server.models
        return JSONResponse({"models": [{"name": s.name, "versions": [str(v) for v in s.registry.numbers],
                                         "platform": PLATFORM, "ready": s.ready} for s in models.served.values()]})

    async def get_config(self, request: Request) -> Response:
        try:
            return JSONResponse(self.config(request.path_params["name"], request.path_params.get("version")))
        except HTTPError as err:
            return refusal(err)

    async def get_stats(self, request: Request) -> Response:
        try:
            return JSONResponse(self.statistics(request.path_params.get("name"), request.path_params.get("version")))
        except HTTPError as err:
            return refusal(err)

    async def index(self, request: Request) -> Response:
        try:
            ready = (await self.body(request)).get("ready", False)
        except HTTPError as err:
            return refusal(err)
        return JSONResponse(self.server.models.index(ready_only=ready is True))

    async def load(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            params = (await self.body(request)).get("parameters") or {}
            if not isinstance(params, dict) or set(params) - {"unload_dependents"}:
                raise HTTPError(400, f"sb serve loads model {name!r} from its source; a config or files in the "
                                "load request are not supported.")
            await self.server.models.load(name)
        except HTTPError as err:
            return refusal(err)
        return JSONResponse({})

    async def unload(self, request: Request) -> Response:
        try:
            await self.body(request)
            await self.server.models.unload(request.path_params["name"])
        except HTTPError as err:
            return refusal(err)
        return JSONResponse({})

    def routes(self) -> list[Route]:
        models, versioned = "/v2/models/{name}", "/v2/models/{name}/versions/{version}"
        return [
            Route("/v2/models", self.list_models, methods=["GET"]),
            Route("/v2/models/stats", self.get_stats, methods=["GET"]),
            Route(f"{models}/config", self.get_config, methods=["GET"]),
            Route(f"{versioned}/config", self.get_config, methods=["GET"]),
            Route(f"{models}/stats", self.get_stats, methods=["GET"]),
            Route(f"{versioned}/stats", self.get_stats, methods=["GET"]),
            Route("/v2/repository/index", self.index, methods=["POST"]),
            Route("/v2/repository/models/{name}/load", self.load, methods=["POST"]),
            Route("/v2/repository/models/{name}/unload", self.unload, methods=["POST"]),
        ]
