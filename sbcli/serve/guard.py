"""Connections that slow or idle clients cannot hold forever: uvicorn's HTTP protocol with three guards.

uvicorn waits for a request head without a deadline and accepts connections until the process
runs out of file descriptors: 1,100 idle half-sent requests took every descriptor of the usual
1,024 and ``/health`` timed out. :class:`GuardedProtocol` is uvicorn's own HTTP/1.1 protocol (h11,
or httptools where installed) with two checks added:

- **Deadline.** A connection whose next request head has not arrived ``header_timeout_s`` after
  it opened (or after its previous answer) is closed, answered 408 when part of a request came: a
  head is a few hundred bytes, so a half-open connection is let go in seconds. Once the head is in,
  the body has ``request_timeout_s``, kept by :func:`sbcli.serve.limits.read_body`.
- **Count.** Past ``max_connections`` open at once, the connection that has been idle longest (no
  request being served: nothing sent yet, a head half-sent, or a kept-alive connection between
  requests) is closed to make room; only when every connection is serving a request is the new one
  answered 503 and closed. So the process keeps descriptors for its model, its log and the requests
  it serves, and idle or half-open sockets cannot keep other clients out (512 of them did, for up to
  the request timeout).
- **Per client.** One address may hold ``max_connections_per_client`` connections at once; past it,
  that client's own longest-idle connection makes room, or the new one is 503 when all are busy.
  asyncio accepts up to the listen backlog in one go before any of those connections is counted,
  so the backlog is sized to fit beside the connections: :func:`accept_backlog` (otherwise a
  burst of connections still runs the process out of descriptors, and asyncio stops accepting
  for a second with a traceback in the log).

A refused connection (503, 408) is answered, its write side shut, and what the client still sends
read and dropped until it closes (bounded in bytes and time) before the close: a socket closed with
unread bytes sends a TCP reset, which can overtake the answer and discard it at the client.

The app hands the settings to the protocol through the lifespan state (:data:`STATE_KEY`), the
ASGI way for an app to share its startup state with the server; without them the protocol is
uvicorn's, unchanged.
"""

from __future__ import annotations

import asyncio
import http
import json
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from sbcli.serve.limits import seconds

STATE_KEY = "sbcli.connection_guard"
DEFAULT_MAX_CONNECTIONS = 512
RESERVED_FILES = 64  # descriptors kept for what is not a connection: the model, logs, onnxruntime, the listening socket
MIN_BACKLOG, MAX_BACKLOG = 16, 2048  # uvicorn's default backlog is 2048
BURSTS = 2  # accept bursts that may come before the first burst's connections are counted (asyncio's call_soon chain)
# After a refusal, what the client sent is read and dropped before the close: closing a socket with unread bytes
# sends a TCP reset, which may reach the client before the answer and discard it. Bounded, so a client that keeps
# sending cannot hold the descriptor: a request head is a few hundred bytes, and a client that read the answer closes.
# At most DRAIN_MAX connections drain at once (past it one is closed at once), so that a burst of refusals holds
# no more descriptors than one more accept backlog.
DRAIN_BYTES = 64 * 1024
DRAIN_S = 2.0
DRAIN_MAX = MIN_BACKLOG


@dataclass(frozen=True)
class ConnectionGuard:
    """How long a request may take to arrive, and how many connections may be open at once (all, and per address)."""

    request_timeout_s: float
    max_connections: int
    header_timeout_s: float | None = None  # None: request_timeout_s
    max_per_client: int | None = None  # None: max_connections

    @property
    def head_s(self) -> float:
        """How long a request head may take: the header timeout, never more than the request timeout."""
        return min(self.header_timeout_s or self.request_timeout_s, self.request_timeout_s)


def open_file_limit() -> int | None:
    """The process's soft limit on open files (None: no limit, or a platform without one)."""
    try:
        import resource
    except ImportError:  # Windows: no RLIMIT_NOFILE
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def connection_room() -> int | None:
    """Descriptors the open-file limit leaves for connections, open or being accepted (None: no limit)."""
    files = open_file_limit()
    return None if files is None else max(0, files - RESERVED_FILES)


def connection_limit() -> int | None:
    """The most connections that may be open at once, leaving room for the smallest accept backlog."""
    room = connection_room()
    return None if room is None else max(1, room - BURSTS * MIN_BACKLOG)


def default_max_connections() -> int:
    """512, or half the room where the open-file limit is lower (1,024 files: 480; macOS's 256: 96)."""
    room = connection_room()
    return DEFAULT_MAX_CONNECTIONS if room is None else max(1, min(DEFAULT_MAX_CONNECTIONS, room // 2))


def accept_backlog(max_connections: int) -> int:
    """The listen backlog: what the open-file limit leaves beside ``max_connections``, split over the bursts."""
    room = connection_room()
    if room is None:
        return MAX_BACKLOG
    return max(MIN_BACKLOG, min(MAX_BACKLOG, (room - max_connections) // BURSTS))


def raw_answer(status: int, sentence: str) -> bytes:
    """A whole HTTP/1.1 response ``{"error": sentence}`` that closes the connection (written before any request is read)."""
    body = json.dumps({"error": sentence}).encode()
    head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class GuardedProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol, closing connections that hold no request in time and those past the limit."""

    _guard: ConnectionGuard | None = None
    _timer: asyncio.TimerHandle | None = None
    _partial = False  # bytes of a request came since the deadline was set
    _idle_since = 0.0  # when the connection last became idle (opened, or answered)
    _draining: int | None = None  # refused: the bytes still read and dropped before the close (None: not refused)

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._guard = self.app_state.get(STATE_KEY)
        if self._guard is None:
            return
        self._arm()
        guard = self._guard
        mine = [c for c in self.connections if _address(c) == _address(self)]
        if guard.max_per_client is not None and len(mine) > guard.max_per_client:
            if not self._make_room(mine):
                self._close(503, f"This client already holds the {guard.max_per_client} connections one address may "
                                 "hold at once, each serving a request; retry when one is answered.")
        elif len(self.connections) > guard.max_connections and not self._make_room(self.connections):
            self._close(503, f"The server already holds the {guard.max_connections} connections it accepts at once, "
                             "each serving a request; retry shortly.")

    def _make_room(self, among: Any) -> bool:
        """Close the connection of ``among`` idle longest (serving no request); False when every one is busy."""
        idle = [c for c in among if c is not self and isinstance(c, GuardedProtocol) and c.idle()]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c._idle_since)
        if oldest._partial:
            oldest._close(503, "The server closed this connection, idle with a request half-sent, to make room for "
                               "another; send the request whole and at once.")
        else:
            oldest.transport.close()
        return True

    def idle(self) -> bool:
        """Serving no request (none begun, or the last one answered) and still open."""
        return (self._draining is None and not self.transport.is_closing()
                and (self.cycle is None or self.cycle.response_complete))

    def data_received(self, data: bytes) -> None:
        if self._draining is not None:  # refused and answered: what still comes is dropped, never parsed
            self._draining -= len(data)
            if self._draining <= 0:
                self.transport.close()
            return
        self._partial = True
        super().data_received(data)

    def eof_received(self) -> bool | None:
        if self._draining is not None:
            self.transport.close()  # the client read the answer and closed: nothing is left unread
            return None
        return super().eof_received()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on a kept-alive connection has the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._guard is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._partial = False
        self._idle_since = self.loop.time()
        self._timer = self.loop.call_later(self._guard.head_s, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self._guard is None or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being served: read_body keeps its body's deadline, the answer takes what it takes
        if self._partial:
            self._close(408, f"The request did not arrive within {seconds(self._guard.head_s)}; "
                             "send it whole and at once.")
        else:
            self.transport.close()

    def _close(self, status: int, sentence: str) -> None:
        """Answer ``status`` and close so that the answer reaches the client: the write side is shut first, then
        what the client sends is dropped (:data:`DRAIN_BYTES`, :data:`DRAIN_S` at most) until it closes too."""
        self.transport.write(raw_answer(status, sentence))
        draining = sum(1 for c in self.connections if getattr(c, "_draining", None) is not None)
        if draining >= DRAIN_MAX or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._draining = DRAIN_BYTES
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(DRAIN_S, self.transport.close)


def _address(protocol: Any) -> str | None:
    """The client's address (its IP) of a connection, None where the transport has none (a Unix socket)."""
    client = getattr(protocol, "client", None)
    return client[0] if client else None
