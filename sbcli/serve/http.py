"""HTTP pieces both of ``sb serve``'s route sets share (its own routes and the inference protocol's)."""

from __future__ import annotations

from starlette.requests import Request


class HTTPError(Exception):
    def __init__(self, status: int, sentence: str) -> None:
        super().__init__(sentence)
        self.status = status


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) from its Content-Length or as soon as the stream passes ``limit``."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise HTTPError(400, "The Content-Length header is not a number.")
        if int(length) > limit:
            raise HTTPError(413, f"The request has {int(length)} bytes, more than the {limit} this server accepts; send fewer or smaller images.")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPError(413, f"The request passed {limit} bytes, more than this server accepts; send fewer or smaller images.")
    return bytes(body)
