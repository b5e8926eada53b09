"""The Open Inference Protocol over gRPC: KServe v2's ``inference.GRPCInferenceService``, as Triton serves it.

``ServerLive``, ``ServerReady``, ``ModelReady``, ``ServerMetadata``, ``ModelMetadata``,
``ModelInfer``, and Triton's ``ModelConfig``, ``ModelStatistics``, ``RepositoryIndex``,
``RepositoryModelLoad`` and ``RepositoryModelUnload``; the rest (streaming, shared memory, trace
and log settings) answer UNIMPLEMENTED. The messages are the ones ``tritonclient[grpc]`` ships
(``service_pb2``, ``model_config_pb2``), so this module, and grpcio, load only with ``--grpc-port``.

Every answer is the HTTP route's, converted: the same dictionaries (metadata, configuration,
statistics, index) parsed into the messages, and the same inference (:func:`sbcli.serve.infer.infer`:
the same checks, limits, queue and statistics). Tensors come from ``raw_input_contents`` or the
typed ``contents`` (``fp32_contents``, ``bytes_contents``); outputs go out in ``raw_output_contents``.
A message larger than ``--max-request-mb`` is refused by gRPC itself (RESOURCE_EXHAUSTED); the
byte budget, the queue and ``--max-connections`` (the RPCs at once) hold as over HTTP. A refusal's
status maps to a gRPC code (:data:`CODES`) with the same one sentence.

The service runs in the HTTP server's event loop (started in its lifespan), so both protocols share
the models, one batcher and one set of statistics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from sbcli.serve import oip_codec as codec
from sbcli.serve.infer import infer
from sbcli.serve.limits import CLIENT_CLOSED, HTTPError
from sbcli.serve.oip import model_metadata, server_metadata
from sbcli.serve.oip_triton import Extensions

logger = logging.getLogger(__name__)
Code = grpc.StatusCode
CODES = {400: Code.INVALID_ARGUMENT, 404: Code.NOT_FOUND, 408: Code.DEADLINE_EXCEEDED, 413: Code.RESOURCE_EXHAUSTED,
         499: Code.CANCELLED, 500: Code.INTERNAL, 503: Code.UNAVAILABLE}
ENDPOINT = "grpc:{}"  # the endpoint label of a gRPC method in sbcli's request metrics


def parameter(params: Any, key: str) -> Any:
    """The value of an InferParameter in a protobuf map (None when absent)."""
    if key not in params:
        return None
    which = params[key].WhichOneof("parameter_choice")
    return getattr(params[key], which) if which else None


def classification(params: Any, where: str) -> int:
    k = parameter(params, "classification")
    if k is None:
        return 0
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise HTTPError(400, f'"classification" {where} must be a whole number of at least 1.')
    return k


def tensor_of(spec: Any, raw: bytes | None) -> codec.Tensor:
    """One request input from its raw contents (when the request sends them) or its typed contents."""
    name, shape = spec.name, list(spec.shape)
    codec.count(shape, name)
    if spec.datatype == "FP32":
        return codec.fp32_raw(name, shape, raw) if raw is not None else codec.fp32_values(name, shape, list(spec.contents.fp32_contents))
    if spec.datatype == "BYTES":
        items = codec.bytes_elements(memoryview(raw), name) if raw is not None else list(spec.contents.bytes_contents)
        return codec.bytes_tensor(name, shape, items)
    raise codec.refuse_datatype(name, spec.datatype)


def request_of(message: Any) -> codec.Request:
    """A ModelInferRequest as the codec's request (the checks HTTP's JSON gets)."""
    raw = list(message.raw_input_contents)
    if raw and len(raw) != len(message.inputs):
        raise HTTPError(400, f"The request has {len(message.inputs)} inputs and {len(raw)} raw contents; send one for each.")
    if not message.inputs:
        raise HTTPError(400, 'The inference request needs "inputs": a list of tensors.')
    inputs = [tensor_of(spec, raw[i] if raw else None) for i, spec in enumerate(message.inputs)]
    outputs = [codec.Wanted(o.name, True, classification(o.parameters, "on an output")) for o in message.outputs]
    return codec.Request(message.id or None, inputs, outputs or None, True, classification(message.parameters, "on the request"))


def response_of(name: str, number: int, parsed: codec.Request, answer: list[tuple[codec.Wanted, np.ndarray]]) -> Any:
    """The ModelInferResponse: every output in ``raw_output_contents`` (BYTES length-prefixed, as Triton writes them)."""
    response = service_pb2.ModelInferResponse(model_name=name, model_version=str(number), id=parsed.id or "")
    for want, tensor in answer:
        out, raw = codec.output(want.name, tensor, True)
        response.outputs.add(name=out["name"], datatype=out["datatype"], shape=out["shape"])
        response.raw_output_contents.append(raw)
    return response


class Service(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The servicer over one server (sbcli.serve.app.Server)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.extensions = Extensions(server)

    async def _answer(self, method: str, context: Any, work: Callable[[], Awaitable[Any]]) -> Any:
        """``work()``'s message, or the refusal it raised as a gRPC status; counted in sbcli's request metrics."""
        start, status = time.perf_counter(), 200
        try:
            return await work()
        except asyncio.CancelledError:  # the client cancelled the call, or its deadline passed
            status = CLIENT_CLOSED
            raise
        except HTTPError as err:
            status = err.status
            await context.abort(CODES.get(err.status, Code.UNKNOWN), str(err))
        except Exception as err:
            if isinstance(err, grpc.aio.AbortError):
                raise
            status = 500
            logger.exception("The model failed on a gRPC %s request", method)
            await context.abort(Code.INTERNAL, f"The model failed on this request ({type(err).__name__}); see the server log.")
        finally:
            if self.server.metrics is not None:
                self.server.metrics.observe_request(ENDPOINT.format(method), status, time.perf_counter() - start)

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.server.models.ready)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            served, _, _ = await self.server.models.resolve(request.name, request.version or None)
        except HTTPError:
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=served.ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return json_format.ParseDict(server_metadata(), service_pb2.ServerMetadataResponse())

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            served, number, model = await self.server.models.resolve(request.name, request.version or None)
            meta = model_metadata(served.name, served.registry.numbers, number, model)
            return json_format.ParseDict(meta, service_pb2.ModelMetadataResponse(), ignore_unknown_fields=True)

        return await self._answer("ModelMetadata", context, work)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            config = json_format.ParseDict(self.extensions.config(request.name, request.version or None),
                                           model_config_pb2.ModelConfig())
            return service_pb2.ModelConfigResponse(config=config)

        return await self._answer("ModelConfig", context, work)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            stats = self.extensions.statistics(request.name or None, request.version or None)
            return json_format.ParseDict(stats, service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=True)

        return await self._answer("ModelStatistics", context, work)

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        entries = self.server.models.index(ready_only=request.ready)
        return service_pb2.RepositoryIndexResponse(models=[service_pb2.RepositoryIndexResponse.ModelIndex(**e) for e in entries])

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            if set(request.parameters) - {"unload_dependents"}:
                raise HTTPError(400, f"sb serve loads model {request.model_name!r} from its source; a config or files in "
                                "the load request are not supported.")
            await self.server.models.load(request.model_name)
            return service_pb2.RepositoryModelLoadResponse()

        return await self._answer("RepositoryModelLoad", context, work)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            await self.server.models.unload(request.model_name)
            return service_pb2.RepositoryModelUnloadResponse()

        return await self._answer("RepositoryModelUnload", context, work)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        async def work() -> Any:
            with self.server.inflight.lease() as lease:  # the message and the tensors parsed from it
                served, number, model = await self.server.models.resolve(request.model_name, request.model_version or None)

                async def parsed() -> codec.Request:
                    lease.take(2 * request.ByteSize())
                    return request_of(request)

                asked, answer = await infer(self.server, (served.name, number), model, parsed, ENDPOINT.format("ModelInfer"))
                return response_of(served.name, number, asked, answer)

        return await self._answer("ModelInfer", context, work)


async def start(server: Any) -> Any:
    """A ``grpc.aio`` server on ``server.cfg.grpc_listen``, started in the running event loop.

    Raises:
        OSError: the address cannot be listened on (checked before the model loaded, so only when taken since).
    """
    cfg = server.cfg
    options = [("grpc.max_receive_message_length", cfg.max_request_bytes), ("grpc.max_send_message_length", -1)]
    grpc_server = grpc.aio.server(options=options, maximum_concurrent_rpcs=cfg.connections)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Service(server), grpc_server)
    try:
        grpc_server.add_insecure_port(cfg.grpc_listen)
    except RuntimeError as err:
        raise OSError(f"Cannot listen on {cfg.grpc_listen} for gRPC ({err}); choose another --grpc-port.") from err
    await grpc_server.start()
    logger.info("gRPC (Open Inference Protocol) on %s", cfg.grpc_listen)
    return grpc_server
