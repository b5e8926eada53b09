"""`sb serve` under abusive or unlucky clients: the bytes of all bodies in flight bounded (503 past
the budget, multipart counted with its parsed copy), half-sent requests answered 408 and closed,
connections past the limit refused, a client that leaves mid-upload not a failure, shapes that
overflow int64 a 400, and every 404 and 405 a JSON error a protocol client can read."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import resource
import socket
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="sb serve's tests need the serving extra (pip install 'sbcli[onnx]')")
# ruff: noqa: E402  (the skip above must come before the serving modules are imported)
from learners import make_learner
from test_serve_http import TIMEOUT, call, free_port, multipart, png, running, wait_until
from test_serve_options import serve_process, wait_healthy

from sbcli.export import onnx as onnx_export
from sbcli.serve import oip_codec as codec
from sbcli.serve.app import ServeConfig, Server, create_app
from sbcli.serve.limits import HTTPError
from sbcli.serve.versions import model_name

KIB = 1024


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("abuse") / "model.onnx"
    onnx_export.export_onnx(make_learner("std"), out)
    return out


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)


def answer(sock: socket.socket) -> tuple[int, dict, dict[str, str]]:
    """The status, JSON body and headers of the response that comes on ``sock``."""
    res = http.client.HTTPResponse(sock)
    res.begin()
    return res.status, json.loads(res.read()), {k.lower(): v for k, v in res.getheaders()}


def head(length: int, kind: str = "image/png", path: str = "/predict") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {kind}\r\nContent-Length: {length}\r\n\r\n".encode()


def post(port: int, body: bytes, kind: str = "image/png") -> tuple[int, dict, dict[str, str]]:
    with connect(port) as sock:
        sock.sendall(head(len(body), kind) + body)
        return answer(sock)


def wait_for(condition, what: str) -> None:  # noqa: ANN001
    wait_until(condition, what, every_s=0.02)


def test_bytes_in_flight_are_bounded_across_requests(model: Path) -> None:
    cfg = ServeConfig(str(model), reload_interval_s=0, max_request_bytes=64 * KIB, max_inflight_bytes=128 * KIB)
    with running(cfg) as (url, server):
        port = int(url.rsplit(":", 1)[1])
        held = [connect(port) for _ in range(2)]
        try:
            for sock in held:  # two uploads of 60 KiB that stop after 100 bytes: 120 KiB of the 128 held
                sock.sendall(head(60 * KIB) + b"\0" * 100)
            wait_for(lambda: server.inflight.used == 120 * KIB, "the two uploads did not hold their bytes")
            body = png(1) + b"\0" * (20 * KIB)
            status, res, headers = post(port, body)
            assert status == 503 and "retry" in res["error"] and headers["content-type"] == "application/json"
            assert headers.get("retry-after") == "1"
            assert len(res["error"].rstrip(".").split(". ")) == 1
            held.pop().close()  # 60 KiB held: a raw body of 40 KiB fits, a multipart one (with its copy) does not
            wait_for(lambda: server.inflight.used == 60 * KIB, "a closed upload kept its bytes")
            image = png(2) + b"\0" * (40 * KIB)
            assert post(port, image)[0] == 200
            status, res, _ = post(port, *multipart([("a.png", image)]))
            assert status == 503, res
        finally:
            for sock in held:
                sock.close()
        wait_for(lambda: server.inflight.used == 0, "the bytes were not given back")
        assert post(port, *multipart([("a.png", image)]))[0] == 200
        assert post(port, body)[0] == 200 and server.inflight.used == 0


def test_half_sent_requests_are_answered_408_and_closed(model: Path) -> None:
    with running(ServeConfig(str(model), reload_interval_s=0, request_timeout_s=1)) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        with connect(port) as sock:  # a head that never ends
            sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n")
            status, res, headers = answer(sock)  # without the guard: no answer ever (the socket's bound is minutes)
            assert status == 408 and "1 second" in res["error"]
            assert headers["content-type"] == "application/json" and sock.recv(1) == b""
        with connect(port) as sock:  # a body that never ends
            sock.sendall(head(1000) + b"\0" * 10)
            status, res, _ = answer(sock)
            assert status == 408 and "did not arrive within 1 second" in res["error"]
            assert sock.recv(1) == b""  # closed after the answer
        with connect(port) as sock:  # nothing at all: closed, nothing answered
            assert sock.recv(1) == b""
        assert call(f"{url}/health")[0] == 200


def busy(port: int) -> socket.socket:
    """A connection serving a request: its head sent whole, its body (1,000 bytes declared) still arriving."""
    sock = connect(port)
    sock.sendall(head(1000) + b"\0" * 10)
    return sock


def health_on_a_new_connection(port: int) -> tuple[int, dict]:
    with connect(port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, res, _ = answer(sock)
    return status, res


def closed_answer(sock: socket.socket) -> tuple[int, dict] | None:
    """The answer on a connection the server closed to make room: (status, body), or None where the server closed it
    before it had read the half-sent head (on a loaded machine the new connection can be handled first): then it
    was idle as far as the server knew, closed without an answer, and the unread bytes made the close a reset."""
    try:
        status, res, _ = answer(sock)
    except (ConnectionResetError, http.client.RemoteDisconnected):
        return None
    return status, res


def test_idle_and_half_open_connections_make_room_for_a_new_client(model: Path) -> None:
    """Before: connections past the limit were refused while idle or half-sent ones held every place (512 of them kept
    every other client at 503 for up to the request timeout). Now the one idle longest is closed to make room."""
    cfg = ServeConfig(str(model), reload_interval_s=0, max_connections=3, request_timeout_s=60, header_timeout_s=60)
    with running(cfg) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        held = [connect(port) for _ in range(3)]
        for sock in held:  # half-open: heads that never end (sent in the order the connections opened)
            sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n")
        with connect(port) as newcomer:  # gets in at once, long before any timeout: the longest idle makes room
            newcomer.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert answer(newcomer)[0] == 200
            told = closed_answer(held[0])  # the half-sent one is closed, and told why when its head was read
            assert told is None or (told[0] == 503 and "to make room" in told[1]["error"]), told
            idle = connect(port)  # nothing sent: closed without an answer when the next one needs its place
            for _ in range(2):
                status, res = health_on_a_new_connection(port)
                assert status == 200 and res["status"] == "ok", res
            told = closed_answer(held[1])
            assert told is None or (told[0] == 503 and "to make room" in told[1]["error"]), told
        for sock in (*held, idle):
            sock.close()


def test_connections_past_the_limit_all_serving_are_refused_and_the_server_stays_reachable(model: Path) -> None:
    cfg = ServeConfig(str(model), reload_interval_s=0, max_connections=3, request_timeout_s=60)
    with running(cfg) as (url, server):
        port = int(url.rsplit(":", 1)[1])
        serving = [busy(port) for _ in range(3)]
        try:
            wait_for(lambda: server.inflight.used == 3000, "the three requests were not being served")
            status, res = health_on_a_new_connection(port)
            assert status == 503 and "each serving a request" in res["error"], res
        finally:
            for sock in serving:
                sock.close()

        def freed() -> bool:
            status = call(f"{url}/health")[0]
            assert status in (200, 503), status
            return status == 200

        wait_until(freed, "the connections' room was never freed")


def test_a_refused_client_that_keeps_sending_still_reads_its_503(model: Path) -> None:
    """Closing a socket with unread bytes sends a reset, which can overtake the answer and discard it. The server
    shuts its side after the 503 and drops what the client still sends, so the 503 arrives whole."""
    cfg = ServeConfig(str(model), reload_interval_s=0, max_connections=1, request_timeout_s=60)
    with running(cfg) as (url, server):
        port = int(url.rsplit(":", 1)[1])
        serving = busy(port)
        try:
            wait_for(lambda: server.inflight.used == 1000, "the request was not being served")
            with connect(port) as sock:
                for _ in range(20):  # a whole request and more, while the server refuses and closes
                    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                status, res, _ = answer(sock)
                assert status == 503 and "each serving a request" in res["error"], res
                assert sock.recv(1) == b""  # then closed, not reset
        finally:
            serving.close()


def test_one_client_cannot_hold_more_than_its_share(model: Path) -> None:
    cfg = ServeConfig(str(model), reload_interval_s=0, max_connections=10, max_connections_per_client=2, request_timeout_s=60)
    with running(cfg) as (url, server):
        port = int(url.rsplit(":", 1)[1])
        serving = [busy(port) for _ in range(2)]
        try:
            wait_for(lambda: server.inflight.used == 2000, "the two requests were not being served")
            status, res = health_on_a_new_connection(port)  # the same address (127.0.0.1): past its share
            assert status == 503 and "connections one address may hold" in res["error"], res
        finally:
            for sock in serving:
                sock.close()
        idle = [connect(port) for _ in range(2)]
        assert health_on_a_new_connection(port)[0] == 200  # its own idle connection made room
        assert sum(sock.recv(1) == b"" for sock in idle[:1]) == 1
        for sock in idle:
            sock.close()


def test_a_half_sent_head_is_let_go_after_the_header_timeout(model: Path) -> None:
    with running(ServeConfig(str(model), reload_interval_s=0, request_timeout_s=60, header_timeout_s=1)) as (url, _):
        with connect(int(url.rsplit(":", 1)[1])) as sock:
            sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n")
            status, res, _ = answer(sock)  # after the header timeout, not the request timeout (the socket's bound: minutes)
            assert status == 408 and "within 1 second" in res["error"], res


def test_half_sent_requests_past_the_descriptor_limit_leave_health_answering(model: Path, tmp_path: Path) -> None:
    """Before: 1,100 idle half-sent requests took every descriptor of a 1,024 limit and /health timed out."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def few_descriptors() -> None:  # the same exhaustion with fewer sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    log = (tmp_path / "stderr.txt").open("w")  # a pipe nobody reads would fill and block the server
    proc = serve_process([str(model), "--port", str(port), "--request-timeout", "2", "--reload-interval", "0"],
                         stderr=log, preexec_fn=few_descriptors)
    socks: list[socket.socket] = []
    try:
        wait_healthy(proc, url)
        for _ in range(300):
            sock = connect(port)
            sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n")
            socks.append(sock)
        status, res = call(f"{url}/health")  # answered at once (busy), not a timeout
        assert status in (200, 503) and ("error" in res or res["status"] == "ok")
        wait_until(lambda: call(f"{url}/health")[0] == 200,  # the half-sent ones are closed after --request-timeout
                   "the half-sent requests were never closed", every_s=0.2)
    finally:
        for sock in socks:
            sock.close()
        proc.terminate()
        proc.communicate(timeout=TIMEOUT)
        log.close()
    # the accept backlog fits beside the connections: asyncio never ran out of descriptors
    assert "Too many open files" not in (tmp_path / "stderr.txt").read_text()


async def asgi(app, method: str, path: str, headers: list[tuple[bytes, bytes]], messages: list[dict]) -> list[dict]:  # noqa: ANN001
    """Call the ASGI app with these request messages (then http.disconnect); what it sent."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    queue, sent = list(messages), []

    async def receive() -> dict:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize("path", ["/predict", "infer"])
def test_a_client_that_leaves_mid_upload_is_one_info_line_and_no_failure(model: Path, path: str,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    server = Server(ServeConfig(str(model), reload_interval_s=0))
    server.load()
    app = create_app(server)
    path = f"/v2/models/{model_name(model)}/infer" if path == "infer" else path
    caplog.set_level(logging.INFO, logger="sbcli")
    headers = [(b"content-type", b"image/png"), (b"content-length", b"5000")]
    if "infer" in path:  # the protocol answers 503 until its versions are listed: list them as the lifespan would
        server.sync()
    asyncio.run(asgi(app, "POST", path, headers, [{"type": "http.request", "body": b"\0" * 1000, "more_body": True},
                                                  {"type": "http.disconnect"}]))
    records = [r for r in caplog.records if r.name.startswith("sbcli")]
    assert len(records) == 1 and records[0].levelno == logging.INFO and records[0].exc_info is None, records
    assert "disconnected" in records[0].getMessage() and "\n" not in records[0].getMessage()
    metrics = server.metrics.render()[0].decode()
    assert "sbcli_request_failures_total{" not in metrics, metrics  # before: counted as a 500
    endpoint = "/v2/models/{name}/infer" if "infer" in path else path
    assert f'sbcli_requests_total{{endpoint="{endpoint}",status="499"}} 1.0' in metrics
    assert server.inflight.used == 0


@pytest.mark.parametrize("shape", [[4611686018427387904, 3, 32, 32], [2**63, 1], [0, 2**70], [2**40, 2**40]])
def test_a_shape_that_overflows_int64_is_a_400(model: Path, shape: list[int]) -> None:
    # np.prod wraps around: 2**62 * 3 * 32 * 32 "is" 0 elements, so no data matched the shape and reshape failed (500)
    for datatype, data in (("FP32", []), ("FP32", [0.0]), ("BYTES", []), ("BYTES", ["AAAA"])):
        body = json.dumps({"inputs": [{"name": "images", "datatype": datatype, "shape": shape, "data": data}]}).encode()
        with pytest.raises(HTTPError) as err:
            codec.parse(body, None)
        assert err.value.status == 400 and "shape" in str(err.value)
    for size in (0, 4):
        binary = {"inputs": [{"name": "images", "datatype": "FP32", "shape": shape, "parameters": {"binary_data_size": size}}]}
        text = json.dumps(binary).encode()
        with pytest.raises(HTTPError) as err:
            codec.parse(text + b"\0" * size, str(len(text)))
        assert err.value.status == 400
    body = json.dumps({"inputs": [{"name": "images", "datatype": "FP32", "shape": shape, "data": []}]}).encode()
    with running(ServeConfig(str(model), reload_interval_s=0)) as (url, _):
        status, res = call(f"{url}/v2/models/{model_name(model)}/infer", body, "application/json")
        assert status == 400 and "shape" in res["error"], res


def test_unrouted_paths_and_methods_answer_json(model: Path) -> None:
    with running(ServeConfig(str(model), reload_interval_s=0)) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        cases = [("GET", "/nope", 404), ("POST", "/v2/trace/setting", 404), ("GET", "/predict", 405),
                 ("DELETE", "/v2/models/x", 405), ("PUT", "/health", 405), ("GET", f"/v2/models/{model_name(model)}/infer", 405)]
        for method, path, want in cases:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
            conn.request(method, path)
            res = conn.getresponse()
            body = json.loads(res.read())
            conn.close()
            assert res.status == want and res.getheader("content-type") == "application/json", (method, path)
            assert isinstance(body["error"], str) and body["error"].endswith("."), body
            if want == 405:
                assert res.getheader("allow"), (method, path)
        httpclient = pytest.importorskip("tritonclient.http")
        from tritonclient.utils import InferenceServerException

        client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=TIMEOUT)
        with pytest.raises(InferenceServerException, match="is not a route of this server"):
            client.get_trace_settings()  # before: a JSON parse error of "Not Found"
