"""`sb serve --max-queue`: past the requests the batcher may hold waiting, a request is refused at once
(HTTP 503 with Retry-After, gRPC UNAVAILABLE), every request accepted is answered right, and the
refusals are counted as Triton counts them (nv_inference_request_failure{reason="REJECTED"})."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("tritonclient.grpc")
# ruff: noqa: E402  (the skip above must come before the serving modules are imported)
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from test_serve_http import TIMEOUT, free_port, running
from test_serve_repository import PLAIN, TwoModels, two_models, wait_ready  # noqa: F401
from tritonclient.utils import InferenceServerException

from sbcli.serve.app import ServeConfig

CLIENTS, REQUESTS = 12, 4  # per protocol: 24 clients at once against a queue of 2 and a model call of 50 ms


def http_infer(url: str, image: np.ndarray) -> tuple[int, dict, str | None]:
    body = json.dumps({"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, *image.shape],
                                   "data": image.reshape(-1).tolist()}], "outputs": [{"name": "logits"}]}).encode()
    req = urllib.request.Request(f"{url}/v2/models/{PLAIN}/infer", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as res:
            return res.status, json.loads(res.read()), None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers.get("Retry-After")


def grpc_infer(client, image: np.ndarray) -> tuple[int, np.ndarray | str, None]:
    inp = grpcclient.InferInput("images", [1, *image.shape], "FP32")
    inp.set_data_from_numpy(image[None])
    try:
        return 200, client.infer(PLAIN, [inp], client_timeout=TIMEOUT).as_numpy("logits"), None
    except InferenceServerException as err:
        return (503 if err.status() == "StatusCode.UNAVAILABLE" else 0), err.message(), None


def test_a_full_queue_refuses_at_once_and_every_accepted_request_is_answered(two_models: TwoModels) -> None:  # noqa: F811
    port = free_port()
    cfg = ServeConfig(str(two_models.plain), reload_interval_s=0, max_queue=2, max_batch_size=1, max_wait_ms=0,
                      grpc_listen=f"127.0.0.1:{port}")
    with running(cfg) as (url, server):
        wait_ready(httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=TIMEOUT))
        model = server.loaded.model
        images = np.random.default_rng(0).random((2 * CLIENTS, 3, 16, 16), dtype=np.float32)
        expected = model.scores(images)
        real = model.scores

        def slow(batch: np.ndarray) -> np.ndarray:
            time.sleep(0.05)
            return real(batch)

        model.scores = slow
        results: list[tuple[str, int, int, object, str | None]] = []
        barrier = threading.Barrier(2 * CLIENTS)

        def client(i: int) -> None:
            channel = grpcclient.InferenceServerClient(f"127.0.0.1:{port}") if i >= CLIENTS else None
            barrier.wait(TIMEOUT)
            for _ in range(REQUESTS):
                if channel is None:
                    status, res, retry = http_infer(url, images[i])
                    results.append(("http", i, status, res, retry))
                else:
                    status, res, _ = grpc_infer(channel, images[i])
                    results.append(("grpc", i, status, res, None))
            if channel is not None:
                channel.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(2 * CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(3 * TIMEOUT)
        model.scores = real
        metrics = server.metrics.triton_text()
        stats = server.stats.to_json([(PLAIN, 1)])["model_stats"][0]["inference_stats"]
        waiting = server.batcher.waiting
    assert len(results) == 2 * CLIENTS * REQUESTS
    refused = [r for r in results if r[2] == 503]
    answered = [r for r in results if r[2] == 200]
    assert len(refused) + len(answered) == len(results), [r for r in results if r[2] not in (200, 503)][:3]
    assert refused and answered and {r[0] for r in refused} == {"http", "grpc"}
    for kind, i, _, res, _ in answered:  # no accepted request failed, and each has its own answer
        logits = np.asarray(res["outputs"][0]["data"], np.float32) if kind == "http" else res.reshape(-1)
        np.testing.assert_allclose(logits, expected[i], rtol=1e-5, atol=1e-5)
    for kind, _, _, res, retry in refused:
        sentence = res["error"] if kind == "http" else res
        assert "requests it queues for the model; retry shortly" in sentence
        assert kind == "grpc" or retry == "1"
    assert stats["success"]["count"] == len(answered) and stats["fail"]["count"] == len(refused)
    assert f'nv_inference_request_failure{{model="{PLAIN}",version="1",reason="REJECTED"}} {len(refused)}\n' in metrics
    assert f'nv_inference_request_success{{model="{PLAIN}",version="1"}} {len(answered)}\n' in metrics
    assert f'nv_inference_pending_request_count{{model="{PLAIN}",version="1"}} 0\n' in metrics and waiting == 0
