"""One inference, whichever route asked: ``/predict``, the v2 REST ``infer`` or gRPC's ModelInfer.

The same steps and the same limits for every protocol: the request's tensors checked against the
model (one input, its datatype, ``[N, 3, S, S]`` or ``[N]`` encoded images, at most ``max_images``),
encoded images decoded within the pixel limits, the images admitted to the batcher's bounded queue
(503 when it is full), the outputs asked for (``logits``, ``probabilities``, each also as a
classification). Each request is counted in Triton's statistics (:mod:`sbcli.serve.stats`) under
the model version that answered it. Only the wire format differs (:mod:`sbcli.serve.oip`,
:mod:`sbcli.serve.grpc_service`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from sbcli.serve import oip_codec as codec
from sbcli.serve.batching import QueueFull
from sbcli.serve.limits import RETRY_AFTER_S, HTTPError, decode_within
from sbcli.serve.classifier import OnnxClassifier
from sbcli.serve.predict import softmax
from sbcli.serve.stats import Key, Record

TENSOR_INPUT, BYTES_INPUT = "images", "image_bytes"
OUTPUTS = ("logits", "probabilities")


def queue_full(server: Any) -> HTTPError:
    return HTTPError(503, f"The server already holds the {server.cfg.max_queue} requests it queues for the model; "
                     "retry shortly.", {"Retry-After": str(RETRY_AFTER_S)})


def admit(server: Any) -> None:
    """Refuse a request at once, before its body is read or decoded, while the batcher's queue is full.

    Raises:
        HTTPError: 503 (with Retry-After).
    """
    if server.batcher.full:
        raise queue_full(server)


async def score(server: Any, key: Key, model: OnnxClassifier, images: np.ndarray, record: Record) -> np.ndarray:
    """The scores of ``images`` from ``model`` through the server's batcher; the timing goes into ``record``.

    Raises:
        HTTPError: 503 (with Retry-After) when ``max_queue`` requests already wait for the batcher.
    """
    try:
        scores, record.timing = await server.batcher.infer(model, images, key)
    except QueueFull as err:  # filled while this request was read and decoded
        raise queue_full(server) from err
    record.images = len(images)
    return scores


async def model_input(server: Any, parsed: codec.Request, model: OnnxClassifier, endpoint: str) -> np.ndarray:
    """float32 [N, 3, S, S] of the request's one input: the tensor itself, or its encoded images decoded."""
    if len(parsed.inputs) != 1 or parsed.inputs[0].name not in (TENSOR_INPUT, BYTES_INPUT):
        raise HTTPError(400, f'Send one input: "{TENSOR_INPUT}" (FP32 [N, 3, H, W]) or "{BYTES_INPUT}" (BYTES [N] encoded images).')
    tensor, size, limit = parsed.inputs[0], model.image_size, server.cfg.max_images
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
    if len(tensor.shape) != 1 and tensor.shape != [n, 1]:  # [N, 1]: Triton's batched form of one element each
        raise HTTPError(400, f'Input "{BYTES_INPUT}" must have shape [N] (or [N, 1]): one encoded image per element.')
    images = [(f"#{i}", bytes(data)) for i, data in enumerate(tensor.data)]
    decoded = await decode_within(model.preprocess, images, server.cfg.request_limits, server.budget)
    if server.metrics is not None:
        server.metrics.images_decoded(endpoint, len(decoded))
    return model.preprocess.to_input(list(decoded))


def outputs(parsed: codec.Request, model: OnnxClassifier, scores: np.ndarray) -> list[tuple[codec.Wanted, np.ndarray]]:
    """Each output asked for (all by default): FP32 [N, C], or BYTES [N, k] ``"value:index:label"`` when classified."""
    values = {"logits": scores.astype(np.float32), "probabilities": softmax(scores.astype(np.float64)).astype(np.float32)}
    wanted = parsed.outputs or [codec.Wanted(name, parsed.binary_default) for name in OUTPUTS]
    out = []
    for want in wanted:
        if want.name not in values:
            raise HTTPError(400, f"Output {want.name!r} is not an output of this model; ask for {' or '.join(OUTPUTS)}.")
        k = want.classification or parsed.classification
        out.append((want, codec.classify(values[want.name], k, model.class_names) if k else values[want.name]))
    return out


async def infer(server: Any, key: Key, model: OnnxClassifier, request: Callable[[], Awaitable[codec.Request]],
                endpoint: str) -> tuple[codec.Request, list[tuple[codec.Wanted, np.ndarray]]]:
    """The request ``request()`` reads and parses, answered by ``model`` (version ``key``), counted in the statistics.

    Raises:
        HTTPError: what reading, parsing, checking or queueing the request refused (its status says which).
    """
    with server.stats.request(key) as record:
        admit(server)
        parsed = await request()
        with record.stage("input_s"):
            images = await model_input(server, parsed, model, endpoint)
        scores = await score(server, key, model, images, record)
        with record.stage("output_s"):
            answer = outputs(parsed, model, scores)
    return parsed, answer
