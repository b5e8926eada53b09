"""What one request may cost the server, checked before the cost is paid; any endpoint calls these.

- :func:`read_body`: the body, refused (413) from its Content-Length or as soon as the stream
  passes the byte limit, (408) when it does not arrive whole within the request timeout, and
  (503) when the bytes of every body in flight would pass the server's :class:`ByteBudget`; a
  client that leaves mid-body is :class:`ClientGone` (one info line, no answer, not a failure).
- :func:`parse_json`: a JSON body, or a 400 for anything malformed, however deeply nested.
- :func:`decode_within`: the images of a request decoded to model input, refused (413) when one
  image or all of them together would decode to more pixels than allowed; sizes are read from the
  headers first, so nothing is decoded before the refusal. Decoding goes through one
  :class:`PixelBudget` per server, so that concurrent requests together never decode more than
  ``max_request_pixels`` at once: the server's decoding memory is bounded whatever the load
  (about 4 bytes a decoded pixel for 8-bit images).
- :func:`release_memory`: hands freed heap pages back to the system after a large request (glibc's
  ``malloc_trim``), so the server's RSS falls back after a large image instead of staying high.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from sbcli.data.pixels import ImageTooLargeError, refuse_pillow_bombs
from sbcli.errors import DataError
from sbcli.serve.preprocess import Preprocess

logger = logging.getLogger(__name__)

MEGA = 1_000_000
DEFAULT_MAX_IMAGE_PIXELS = 40 * MEGA  # a 40-megapixel PNG; JPEGs are decoded at a reduced scale first
DEFAULT_MAX_REQUEST_PIXELS = 120 * MEGA
TRIM_AFTER_PIXELS = 4 * MEGA  # a request that decoded (or sent) more than these hands its freed memory back
TRIM_AFTER_BYTES = 4 * 2**20
CLIENT_CLOSED = 499  # nginx's "client closed request": the client left before its request was read
CLOSE = {"Connection": "close"}  # a client too slow to send its body is not waited for again on that connection
RETRY_AFTER_S = 1


class HTTPError(Exception):
    """A request refused: its HTTP status, one sentence for the client and any headers of the answer."""

    def __init__(self, status: int, sentence: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(sentence)
        self.status = status
        self.headers = headers or {}


class ClientGone(HTTPError):
    """The client disconnected before its request body arrived: there is no one to answer."""

    def __init__(self, path: str) -> None:
        super().__init__(CLIENT_CLOSED, f"The client disconnected before its request to {path} arrived whole.")


def refusal(err: HTTPError) -> JSONResponse:
    """The answer to a refused request: ``{"error": sentence}`` with its status and headers."""
    return JSONResponse({"error": str(err)}, status_code=err.status, headers=err.headers)


def seconds(value: float) -> str:
    return f"{value:g} second{'' if value == 1 else 's'}"


@dataclass(frozen=True)
class RequestLimits:
    """The most one request may send and make the server decode."""

    max_request_bytes: int = 16 * 2**20
    max_images: int = 64
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_request_pixels: int = DEFAULT_MAX_REQUEST_PIXELS

    def to_json(self) -> dict[str, int]:
        return {"max_request_bytes": self.max_request_bytes, "max_images": self.max_images,
                "max_image_pixels": self.max_image_pixels, "max_request_pixels": self.max_request_pixels}


@dataclass
class PixelBudget:
    """Pixels being decoded at once across every request, at most ``capacity``; waiters served in order."""

    capacity: int
    used: int = 0
    _waiters: deque[tuple[int, asyncio.Future[None]]] = field(default_factory=deque)

    @contextlib.asynccontextmanager
    async def hold(self, pixels: int) -> AsyncIterator[None]:
        """Wait until ``pixels`` (at most the capacity) fit beside those being decoded, and hold them."""
        pixels = min(pixels, self.capacity)
        if self._waiters or self.used + pixels > self.capacity:
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((pixels, granted))
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():
                    self._release(pixels)  # granted just as the request was cancelled
                else:
                    self._wake()
                raise
        else:
            self.used += pixels
        try:
            yield
        finally:
            self._release(pixels)

    def _release(self, pixels: int) -> None:
        self.used -= pixels
        self._wake()

    def _wake(self) -> None:
        while self._waiters and (self._waiters[0][1].done() or self.used + self._waiters[0][0] <= self.capacity):
            pixels, granted = self._waiters.popleft()
            if not granted.done():
                self.used += pixels
                granted.set_result(None)


@dataclass
class ByteBudget:
    """Bytes of request bodies held at once by every request together, at most ``capacity``.

    Past it a request is refused at once (503, ``Retry-After``) instead of waiting its turn as
    decoding does (:class:`PixelBudget`): a waiting upload would still hold its connection, and a
    client or load balancer can better retry elsewhere. Every request runs in one event loop, so
    no lock is needed.
    """

    capacity: int
    used: int = 0

    @contextlib.contextmanager
    def lease(self) -> Iterator[Lease]:
        """What one request holds; all of it given back when the request ends, however it ends."""
        lease = Lease(self)
        try:
            yield lease
        finally:
            lease.release()


@dataclass
class Lease:
    """The bytes one request holds of a :class:`ByteBudget`."""

    budget: ByteBudget
    held: int = 0

    def take(self, n: int) -> None:
        """Hold ``n`` more bytes, or raise HTTPError 503 when the budget has not that many left."""
        budget = self.budget
        if budget.used + n > budget.capacity:
            raise HTTPError(503, f"The server is already receiving {budget.used:,} of the {budget.capacity:,} request "
                            f"bytes it holds at once; retry shortly.", {"Retry-After": str(RETRY_AFTER_S)})
        budget.used += n
        self.held += n

    def release(self) -> None:
        self.budget.used -= self.held
        self.held = 0


def _declared_length(request: Request, limit: int) -> int | None:
    length = request.headers.get("content-length")
    if length is None:
        return None
    if not length.isdigit():
        raise HTTPError(400, "The Content-Length header is not a number.")
    if int(length) > limit:
        raise HTTPError(413, f"The request has {int(length)} bytes, more than the {limit} this server accepts; send fewer or smaller images.")
    return int(length)


async def read_body(request: Request, limit: int, lease: Lease | None = None, *, copies: int = 1,
                    timeout_s: float | None = None) -> bytes:
    """The request body, refused (413) from its Content-Length or as soon as the stream passes ``limit``.

    ``lease`` holds ``copies`` times the body's bytes (2 where parsing copies them: multipart files,
    base64 in JSON, tensors), from the Content-Length before a byte is read, or chunk by chunk.

    Raises:
        HTTPError: 400 (a Content-Length that is not a number), 413 (too large), 408 (the body did
            not arrive whole within ``timeout_s``), 503 (the server's byte budget is spent).
        ClientGone: the client disconnected before the body arrived (logged as one info line).
    """
    counted = _declared_length(request, limit) or 0
    if lease is not None:
        lease.take(counted * copies)  # refused before a byte is read
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise HTTPError(413, f"The request passed {limit} bytes, more than this server accepts; send fewer or smaller images.")
                if lease is not None and len(body) > counted:  # chunked: no length was declared up front
                    lease.take((len(body) - counted) * copies)
                    counted = len(body)
    except TimeoutError as err:
        raise HTTPError(408, f"The request body did not arrive within {seconds(timeout_s or 0)}; send it whole and at once.",
                        CLOSE) from err
    except ClientDisconnect as err:
        logger.info("A client disconnected before its request to %s arrived whole; nothing was answered.", request.url.path)
        raise ClientGone(request.url.path) from err
    return bytes(body)


def parse_json(body: bytes) -> Any:
    """The JSON value of ``body``; malformed JSON of any kind or depth is a 400.

    Raises:
        HTTPError: 400 when ``body`` is not UTF-8 JSON, or nests too deeply for the parser.
    """
    try:
        return json.loads(body)
    except RecursionError as err:  # the C parser's guard against deep nesting (a 500 otherwise)
        raise HTTPError(400, "The JSON body nests too deeply; send a flat object.") from err
    except ValueError as err:
        raise HTTPError(400, f"The JSON body is not valid JSON ({err}).") from err


def _measure(preprocess: Preprocess, images: Sequence[tuple[str, bytes]], limits: RequestLimits) -> list[int]:
    """The pixels each image would decode to (from its header), refusing as the limits say."""
    counts = []
    for name, data in images:
        count = preprocess.decoded_pixels(data, name, limits.max_image_pixels)
        if count > limits.max_image_pixels:
            raise HTTPError(413, f"Image {name} would decode to {count:,} pixels, more than the "
                                 f"{limits.max_image_pixels:,} this server decodes per image; send a smaller image.")
        counts.append(count)
    if sum(counts) > limits.max_request_pixels:
        raise HTTPError(413, f"The request's images would decode to {sum(counts):,} pixels, more than the "
                             f"{limits.max_request_pixels:,} this server decodes per request; send fewer or smaller images.")
    return counts


async def decode_within(preprocess: Preprocess, images: Sequence[tuple[str, bytes]], limits: RequestLimits,
                        budget: PixelBudget) -> list[np.ndarray]:
    """uint8 [3, H, W] of every (name, encoded bytes), decoded on the default executor within the limits.

    Raises:
        HTTPError: 413 (one image or the request would decode to too many pixels; nothing was
            decoded), 400 (an image that Pillow cannot read or decode).
    """
    loop = asyncio.get_running_loop()

    async def one(name: str, data: bytes, pixels: int) -> np.ndarray:
        async with budget.hold(pixels):
            return await loop.run_in_executor(None, preprocess.decode, data, name, limits.max_image_pixels)

    counts: list[int] = []
    try:
        counts = await loop.run_in_executor(None, _measure, preprocess, images, limits)
        return list(await asyncio.gather(*(one(name, data, n) for (name, data), n in zip(images, counts, strict=True))))
    except ImageTooLargeError as err:
        raise HTTPError(413, str(err)) from err
    except DataError as err:
        raise HTTPError(400, str(err)) from err
    finally:
        if sum(counts) > TRIM_AFTER_PIXELS or sum(len(data) for _, data in images) > TRIM_AFTER_BYTES:
            await loop.run_in_executor(None, release_memory)


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_memory() -> bool:
    """Give the heap's free pages back to the system (glibc ``malloc_trim``); False where unavailable."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def start_policy() -> None:
    """Process-wide settings of a server process: Pillow's bomb warning is a refusal, not a log line."""
    refuse_pillow_bombs()
