"""`sb serve`: the HTTP routes, formats, refusals, dynamic batching, reload under load, learner
directories and --workers. Servers listen on 127.0.0.1 on a free port; every request has a timeout."""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

uvicorn = pytest.importorskip("uvicorn", reason="sb serve's HTTP tests need the serving extra (pip install 'sbcli[onnx]')")
# ruff: noqa: E402  (the skip above must come before the serving modules are imported)
from learners import make_learner
from PIL import Image
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.errors import ConfigError
from sbcli.export import onnx as onnx_export
from sbcli.export.serving import EXPORTER
from sbcli.serve.app import ServeConfig, Server, create_app
from sbcli.serve.guard import GuardedProtocol
from sbcli.serve.classifier import open_onnx
from sbcli.serve.predict import predict
from sbcli.serve.predict import top_k as rank

TIMEOUT = 120  # one request's bound: well under a second on an idle machine; a loaded one is slower, not stuck
WAIT_S = 600  # the bound on waiting for an event (a start, an export, a reload): minutes, past any loaded machine


def wait_until(condition: Callable[[], Any], what: str, alive: Callable[[], bool] = lambda: True,
               ignoring: tuple[type[BaseException], ...] = (), every_s: float = 0.05) -> Any:
    """Poll ``condition`` until it holds and return its value. The wait is on the event, not on a deadline: it
    fails with ``what`` when ``alive()`` turns false (the server died) or only after WAIT_S; ``ignoring``: the
    errors that mean "not yet" (a server not listening yet)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            value = condition()
        except ignoring:
            value = None
        if value:
            return value
        assert alive() and time.monotonic() < deadline, what
        time.sleep(every_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(cfg: ServeConfig) -> Iterator[tuple[str, Server]]:
    """A server in a thread of this process; its URL and state."""
    server = Server(cfg)
    port = free_port()
    userver = uvicorn.Server(uvicorn.Config(create_app(server), host="127.0.0.1", port=port, log_level="warning",
                                           http=GuardedProtocol))  # as `sb serve` runs it (sbcli.serve.server.run)
    thread = threading.Thread(target=userver.run, daemon=True)
    thread.start()
    wait_until(lambda: userver.started, "the server did not start", alive=thread.is_alive)  # a learner is exported first
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        userver.should_exit = True
        thread.join(TIMEOUT)


def call(url: str, body: bytes | None = None, content_type: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type} if content_type else {})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def multipart(files: list[tuple[str, bytes]], fields: dict[str, str] | None = None) -> tuple[bytes, str]:
    boundary = "sbcli-test-boundary"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in (fields or {}).items()]
    for name, data in files:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{name}"\r\n'
                     f"Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def png(seed: int, size: tuple[int, int] = (16, 16)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("http") / "model.onnx"
    onnx_export.export_onnx(make_learner("std"), out)
    return out


def renamed(model: Path, out: Path, prefix: str) -> Path:
    """The same model with other class names (a stand-in for a newly exported step)."""
    proto = onnx.load(str(model))
    for prop in proto.metadata_props:
        if prop.key == "class_names":
            prop.value = json.dumps([f"{prefix}{i}" for i in range(len(json.loads(prop.value)))])
    onnx.save_model(proto, str(out))
    return out


def test_routes_and_request_formats(model: Path, tmp_path: Path) -> None:
    images = {f"img{i}.png": png(i, (16 + 7 * i, 16)) for i in range(3)}
    for name, data in images.items():
        (tmp_path / name).write_bytes(data)
    expected = {Path(p.image).name: p for p in predict(model, [tmp_path], top_k=3).predictions}
    with running(ServeConfig(str(model), top_k=3, reload_interval_s=0)) as (url, _):
        status, health = call(f"{url}/health")
        assert status == 200 and health == {"status": "ok", "model_version": 1, "provider": "cpu"}
        status, meta = call(f"{url}/metadata")
        assert status == 200 and meta["classes"] == ["class_0", "class_1", "class_2", "class_3", "class_4"]
        assert meta["input_size"] == [3, 16, 16] and meta["provider"] == "cpu" and meta["kind"] == "onnx"
        assert meta["provenance"] == {"dataset": "synthetic", "sbcli_version": "test"} and meta["sbcli_format"] == "2"
        assert meta["preprocess"]["resize"]["filter"] == "bilinear"

        status, res = call(f"{url}/predict", *multipart(list(images.items())))
        assert status == 200 and [p["image"] for p in res["predictions"]] == list(images)
        for p in res["predictions"]:
            want = expected[p["image"]]
            assert [t["label"] for t in p["top"]] == want.labels
            np.testing.assert_allclose([t["probability"] for t in p["top"]], want.probabilities, atol=1e-6)
        body = json.dumps({"images": [base64.b64encode(d).decode() for d in images.values()], "top_k": 2}).encode()
        status, res = call(f"{url}/predict", body, "application/json")
        assert status == 200 and [len(p["top"]) for p in res["predictions"]] == [2, 2, 2]
        assert [p["top"][0]["label"] for p in res["predictions"]] == [expected[n].labels[0] for n in images]
        status, res = call(f"{url}/predict?top_k=1", images["img0.png"], "image/png")
        assert status == 200 and res["predictions"][0]["top"][0]["label"] == expected["img0.png"].labels[0]
        assert len(res["predictions"][0]["top"]) == 1 and res["provider"] == "cpu" and res["model_version"] == 1


def test_bad_requests_are_one_sentence_and_the_server_goes_on(model: Path) -> None:
    with running(ServeConfig(str(model), max_images=4, reload_interval_s=0)) as (url, _):
        cases = [
            (multipart([("broken.jpg", b"\xff\xd8 not a jpeg")]), 400, "Cannot decode image broken.jpg"),
            ((b"{not json", "application/json"), 400, "not valid JSON"),
            ((b'{"images": ["***"]}', "application/json"), 400, "not valid base64"),
            ((b'{"pictures": []}', "application/json"), 400, '"images"'),
            ((b"hello", "text/plain"), 415, "multipart/form-data"),
            (multipart([("a.png", png(1))], {"top_k": "0"}), 400, "top_k"),
            (multipart([(f"{i}.png", png(i)) for i in range(5)]), 413, "more than the 4"),
        ]
        for (body, kind), status, words in cases:
            got, res = call(f"{url}/predict", body, kind)
            assert got == status and words in res["error"], (words, res)
            assert len(res["error"].rstrip(".").split(". ")) == 1  # one sentence
        assert call(f"{url}/predict", *multipart([("a.png", png(1))]))[0] == 200
        assert call(f"{url}/health")[1]["status"] == "ok"


def raw_post(port: int, head: str, body: bytes) -> tuple[int, bytes]:
    """Send a request that may never finish its body; the status line the server answers with."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(head.encode() + body)
        res = http.client.HTTPResponse(sock)
        res.begin()
        return res.status, res.read()


def test_oversized_requests_are_refused_before_being_read(model: Path) -> None:
    limit = 64 * 1024
    with running(ServeConfig(str(model), max_request_bytes=limit, reload_interval_s=0)) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        # Content-Length says 100 MB and no byte of the body is sent: the answer comes at once.
        status, data = raw_post(port, "POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                                      f"Content-Length: {100 * 2**20}\r\n\r\n", b"")
        assert status == 413 and b"more than the 65536" in data
        # Chunked (no length): refused once the stream passes the limit, though the body never ends.
        chunk = b"%x\r\n" % 8192 + b"\0" * 8192 + b"\r\n"
        status, data = raw_post(port, "POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                                      "Transfer-Encoding: chunked\r\n\r\n", chunk * 10)
        assert status == 413 and b"passed 65536 bytes" in data
        assert call(f"{url}/predict", png(3), "image/png")[0] == 200


def test_concurrent_requests_are_batched(model: Path) -> None:
    clients = 8
    with running(ServeConfig(str(model), max_batch_size=clients, max_wait_ms=1000, reload_interval_s=0)) as (url, server):
        barrier, results = threading.Barrier(clients), [None] * clients

        def client(i: int) -> None:
            barrier.wait(TIMEOUT)
            results[i] = call(f"{url}/predict", png(i), "image/png")

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert all(r is not None and r[0] == 200 for r in results)
        stats = server.batcher.stats
        assert stats.images == clients and stats.batches < clients and stats.largest > 1
        alone = open_onnx(model, "cpu")
        for i, (_, res) in enumerate(results):  # batching never changes an answer
            (want,) = rank(alone.scores(alone.preprocess.to_input([alone.preprocess.decode(png(i))])), alone.class_names, 5, ["x"])
            assert [t["label"] for t in res["predictions"][0]["top"]] == want.labels
            np.testing.assert_allclose([t["probability"] for t in res["predictions"][0]["top"]], want.probabilities, atol=1e-6)


def test_reload_under_load_drops_no_request(model: Path, tmp_path: Path) -> None:
    served = tmp_path / "served.onnx"
    served.write_bytes(model.read_bytes())
    staged = renamed(model, tmp_path / "next.onnx", "new_")
    with running(ServeConfig(str(served), reload_interval_s=0.1, max_wait_ms=2)) as (url, _):
        stop, outcomes = threading.Event(), []

        def client(seed: int) -> None:
            while not stop.is_set():
                status, res = call(f"{url}/predict", png(seed), "image/png")
                outcomes.append((status, res.get("model_version"), res.get("predictions", [{}])[0].get("top", [{}])[0].get("label")))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        os.replace(staged, served)  # how `sb export -o served.onnx` replaces a file
        wait_until(lambda: call(f"{url}/health")[1]["model_version"] == 2, "the server did not reload")
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(TIMEOUT)
    assert outcomes and all(status == 200 for status, _, _ in outcomes)
    versions = {v for _, v, _ in outcomes}
    assert versions == {1, 2}
    assert all(label.startswith("new_") == (v == 2) for _, v, label in outcomes)


def test_serving_a_learner_directory_exports_and_reloads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    learner = make_learner("std", tasks=(3,))
    learner.save(tmp_path / "learner")
    with running(ServeConfig(str(tmp_path / "learner"), reload_interval_s=0.2, exporter=EXPORTER)) as (url, _):
        meta = call(f"{url}/metadata")[1]
        assert meta["classes"] == ["class_0", "class_1", "class_2"] and meta["source"] == str(tmp_path / "learner")
        assert Path(meta["path"]).parent == tmp_path / "cache" / "sbcli" / "serve"
        make_learner("std", tasks=(3, 2)).save(tmp_path / "learner")  # a new step: five classes
        meta = wait_until(lambda: (m := call(f"{url}/metadata")[1])["model_version"] == 2 and m,
                          "the server did not reload the learner")  # an export: minutes on a loaded machine
        assert len(meta["classes"]) == 5 and call(f"{url}/predict", png(0), "image/png")[0] == 200


def test_serve_opens_a_learner_directory_only_through_the_exporter_it_is_handed(tmp_path: Path) -> None:
    make_learner("std", tasks=(3,)).save(tmp_path / "learner")
    with pytest.raises(ConfigError, match="is a learner directory; export it"):
        Server(ServeConfig(str(tmp_path / "learner"), reload_interval_s=0)).load()


def test_cli_refuses_bad_options_in_one_sentence(model: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["serve", str(tmp_path)])
    assert res.exit_code == 1 and "neither a learner directory" in res.output
    res = runner.invoke(app, ["serve", str(model), "--max-batch-size", "0"])
    assert res.exit_code == 1 and "--max-batch-size must be at least 1" in res.output
    res = runner.invoke(app, ["serve", str(model), "--provider", "cuda"])
    if "CUDAExecutionProvider" not in __import__("onnxruntime").get_available_providers():
        assert res.exit_code == 1 and "--provider cuda is not available" in res.output


def test_cli_with_two_workers(model: Path) -> None:
    from sbcli.serve.server import cpu_cores

    if cpu_cores() < 2:
        pytest.skip("--workers is at most the CPU cores, and this machine has one")
    port, metrics = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "sbcli", "serve", str(model), "--port", str(port), "--workers", "2",
                             "--reload-interval", "0", "--metrics-port", str(metrics)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        status, health = wait_until(lambda: call(f"http://127.0.0.1:{port}/health"), "sb serve --workers 2 did not start",
                                    alive=lambda: proc.poll() is None, ignoring=(urllib.error.URLError, ConnectionError))
        assert status == 200 and health["provider"] == "cpu"
        for i in range(4):
            assert call(f"http://127.0.0.1:{port}/predict", png(i), "image/png")[0] == 200
        # the metrics port (Triton's 8002) answers GET /metrics, and nothing else, in each worker
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=TIMEOUT) as res:
            assert res.status == 200 and b"nv_inference_count" in res.read()
        status, res = call(f"http://127.0.0.1:{metrics}/predict", png(0), "image/png")
        assert status == 404 and "serves GET /metrics alone" in res["error"]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=TIMEOUT)
    assert f"on http://127.0.0.1:{port} with 2 worker(s)" in " ".join(err.split())
    assert max(len(line) for line in err.splitlines()) < 400  # not padded to the width of a console


def test_http_client_sees_keepalive_connections_survive_a_bad_request(model: Path) -> None:
    with running(ServeConfig(str(model), reload_interval_s=0)) as (url, _):
        conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=TIMEOUT)
        conn.request("POST", "/predict", body=b"junk", headers={"Content-Type": "image/png"})
        assert conn.getresponse().read() and True
        conn.request("POST", "/predict", body=png(1), headers={"Content-Type": "image/png"})
        res = conn.getresponse()
        assert res.status == 200 and json.loads(res.read())["predictions"]
        conn.close()


def test_a_failing_model_is_a_500_and_the_server_goes_on(model: Path) -> None:
    with running(ServeConfig(str(model), reload_interval_s=0)) as (url, server):
        good = server.loaded.model.scores

        def broken(images: np.ndarray) -> np.ndarray:
            raise RuntimeError("boom")

        server.loaded.model.scores = broken
        status, res = call(f"{url}/predict", png(1), "image/png")
        assert status == 500 and "The model failed on this request (RuntimeError)" in res["error"]
        server.loaded.model.scores = good
        assert call(f"{url}/predict", png(1), "image/png")[0] == 200
