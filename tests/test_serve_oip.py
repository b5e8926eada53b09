"""`sb serve` on the Open Inference Protocol, checked with Triton's own HTTP client
(`tritonclient.http.InferenceServerClient`): health, metadata, versions (learner steps), inference
with numpy batches, binary data, encoded images and classification, all equal to `sb predict`."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from learners import make_learner
from test_serve_http import TIMEOUT, WAIT_S, png, running, wait_until

from sbcli.export.serving import EXPORTER, learner_onnx, open_learner
from sbcli.serve.app import ServeConfig
from sbcli.serve.predict import predict

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

NAME = "learner"


@pytest.fixture(scope="module")
def learner_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A learner with two kept steps: 3 classes after step 1, 5 after step 2."""
    root = tmp_path_factory.mktemp("oip") / NAME
    make_learner("std", tasks=(3,)).save(root)
    make_learner("std", tasks=(3, 2), seed=1).save(root)
    return root


@pytest.fixture(scope="module")
def images(learner_dir: Path) -> tuple[list[Path], list]:
    folder = learner_dir.parent / "images"
    folder.mkdir()
    files = []
    for i in range(4):
        (folder / f"img{i}.png").write_bytes(png(i, (16 + 5 * i, 16)))
        files.append(folder / f"img{i}.png")
    return files, predict(learner_dir, files, top_k=3, open_learner=open_learner).predictions


@pytest.fixture(scope="module")
def served(learner_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(cache))
        learner_onnx(learner_dir)  # the export the server does at startup, done first: its start stays quick
        with running(ServeConfig(str(learner_dir), reload_interval_s=0, exporter=EXPORTER)) as (url, server):
            client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=TIMEOUT)
            wait_until(client.is_server_ready, "the server did not become ready")  # the earlier step is exported first
            yield url, client, server


def tensor_batch(server, files: list[Path]) -> np.ndarray:
    """The FP32 [N, 3, S, S] input the model's own preprocessing makes of ``files``."""
    pre = server.loaded.model.preprocess
    return pre.to_input([pre.decode(f.read_bytes(), f.name) for f in files])


def test_health_and_metadata(served) -> None:
    _, client, _ = served
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "sbcli" and {"binary_tensor_data", "classification"} <= set(meta["extensions"])
    model = client.get_model_metadata(NAME)
    assert model["name"] == NAME and model["versions"] == ["1", "2"] and model["platform"] == "onnxruntime_onnx"
    assert {i["name"]: (i["datatype"], i["shape"]) for i in model["inputs"]} == {
        "images": ("FP32", [-1, 3, 16, 16]), "image_bytes": ("BYTES", [-1])}
    assert {o["name"]: o["shape"] for o in model["outputs"]} == {"logits": [-1, 5], "probabilities": [-1, 5]}
    older = client.get_model_metadata(NAME, "1")
    assert older["outputs"][0]["shape"] == [-1, 3] and older["parameters"]["labels"] == ["class_0", "class_1", "class_2"]
    assert client.is_model_ready(NAME) and client.is_model_ready(NAME, "1") and client.is_model_ready(NAME, "2")
    assert not client.is_model_ready(NAME, "7")
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("other")
    assert err.value.status() == "404" and "not served here" in err.value.message()


@pytest.mark.parametrize("binary", [False, True])
def test_numpy_batch_equals_sb_predict(served, images, binary: bool) -> None:
    _, client, server = served
    files, expected = images
    batch = tensor_batch(server, files)
    inp = httpclient.InferInput("images", list(batch.shape), "FP32")
    inp.set_data_from_numpy(batch, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("logits", "probabilities")]
    result = client.infer(NAME, [inp], outputs=outputs, request_id="r1")
    assert result.get_response()["model_version"] == "2" and result.get_response()["id"] == "r1"
    probs = result.as_numpy("probabilities")
    np.testing.assert_allclose(result.as_numpy("logits"), server.loaded.model.scores(batch), rtol=1e-5, atol=1e-5)
    for row, want in zip(probs, expected, strict=True):
        best = np.argsort(-row, kind="stable")[:3]
        assert [f"class_{i}" for i in best] == want.labels
        np.testing.assert_allclose(row[best], want.probabilities, atol=1e-5)


@pytest.mark.parametrize("binary", [False, True])
def test_encoded_images_with_classification_equal_sb_predict(served, images, binary: bool) -> None:
    _, client, _ = served
    files, expected = images
    data = [f.read_bytes() for f in files]
    if binary:
        inp = httpclient.InferInput("image_bytes", [len(files)], "BYTES")
        inp.set_data_from_numpy(np.array(data, dtype=object), binary_data=True)
    else:  # JSON cannot hold raw bytes: base64 strings
        inp = httpclient.InferInput("image_bytes", [len(files)], "BYTES")
        inp.set_data_from_numpy(np.array([base64.b64encode(d) for d in data], dtype=object), binary_data=False)
    out = httpclient.InferRequestedOutput("probabilities", binary_data=binary, class_count=3)
    result = client.infer(NAME, [inp], outputs=[out])
    table = result.as_numpy("probabilities")
    assert table.shape == (len(files), 3)
    for row, want in zip(table, expected, strict=True):
        parts = [(b if isinstance(b, bytes) else str(b).encode()).decode().split(":") for b in row]
        assert [p[2] for p in parts] == want.labels and [f"class_{p[1]}" for p in parts] == want.labels
        np.testing.assert_allclose([float(p[0]) for p in parts], want.probabilities, atol=1e-5)


def test_versions_answer_as_their_step(served, images) -> None:
    _, client, server = served
    files, _ = images
    batch = tensor_batch(server, files)
    inp = httpclient.InferInput("images", list(batch.shape), "FP32")
    inp.set_data_from_numpy(batch)
    old = client.infer(NAME, [inp], model_version="1")
    assert old.get_response()["model_version"] == "1" and old.as_numpy("logits").shape == (len(files), 3)
    with pytest.raises(InferenceServerException) as err:
        client.infer(NAME, [inp], model_version="9")
    assert err.value.status() == "404" and "versions: 1, 2" in err.value.message()


def post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_protocol_errors_are_one_sentence(served) -> None:
    url, _, _ = served
    infer = f"{url}/v2/models/{NAME}/infer"
    ok = {"name": "images", "datatype": "FP32", "shape": [1, 3, 16, 16], "data": [0.5] * 768}
    cases = [
        (b"{nope", {}, 400, "not valid JSON"),
        (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, 400, "not valid JSON"),  # nesting too deep
        (json.dumps({"inputs": []}).encode(), {}, 400, '"inputs"'),
        (json.dumps({"inputs": [{**ok, "shape": [1, 3, 8, 8], "data": [0.0] * 192}]}).encode(), {}, 400, "must have shape"),
        (json.dumps({"inputs": [{**ok, "data": [0.5] * 10}]}).encode(), {}, 400, "needs 768"),
        (json.dumps({"inputs": [{**ok, "datatype": "INT8"}]}).encode(), {}, 400, "datatype"),
        (json.dumps({"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [1], "data": ["***"]}]}).encode(), {}, 400, "base64"),
        (json.dumps({"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [1],
                                 "data": [base64.b64encode(b"junk").decode()]}]}).encode(), {}, 400, "Cannot decode image #0"),
        (json.dumps({"inputs": [ok], "outputs": [{"name": "nope"}]}).encode(), {}, 400, "not an output"),
        (json.dumps({"inputs": [ok]}).encode() + b"xx", {"Inference-Header-Content-Length": "9999"}, 400, "within the body"),
        (json.dumps({"inputs": [{**ok, "shape": [65, 3, 16, 16], "data": [0.5] * 768 * 65}]}).encode(), {}, 413, "more than the 64"),
    ]
    for body, headers, status, words in cases:
        got, res = post(infer, body, headers)
        assert got == status and words in res["error"], (words, res)
        assert len(res["error"].rstrip(".").split(". ")) == 1
    assert post(f"{url}/v2/models/{NAME}/versions/3/infer", json.dumps({"inputs": [ok]}).encode())[0] == 404
    assert post(infer, json.dumps({"inputs": [ok]}).encode())[0] == 200


def test_metrics_parse_with_prometheus_client(served) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    url, client, _ = served
    client.is_server_live()
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("other")
    inp = httpclient.InferInput("image_bytes", [2], "BYTES")
    inp.set_data_from_numpy(np.array([png(1), png(2)], dtype=object))
    client.infer(NAME, [inp])
    raw = urllib.request.Request(f"{url}/predict", data=png(3), headers={"Content-Type": "image/png"})
    with urllib.request.urlopen(raw, timeout=TIMEOUT) as res:
        assert res.status == 200
    with urllib.request.urlopen(f"{url}/metrics", timeout=TIMEOUT) as res:
        assert res.headers["Content-Type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(res.read().decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("sbcli_requests_total", (("endpoint", "/v2/health/live"), ("status", "200")))] >= 1
    assert samples[("sbcli_request_failures_total", (("endpoint", "/v2/models/{name}"), ("status", "404")))] >= 1
    assert ("sbcli_request_failures_total", (("endpoint", "/v2/health/live"), ("status", "200"))) not in samples
    assert samples[("sbcli_images_decoded_total", (("endpoint", "/v2/models/{name}/infer"),))] >= 2
    assert samples[("sbcli_images_decoded_total", (("endpoint", "/predict"),))] >= 1
    assert samples[("sbcli_requests_total", (("endpoint", "/predict"), ("status", "200")))] >= 1
    assert samples[("sbcli_batch_size_count", ())] >= 1 and samples[("sbcli_batch_size_sum", ())] >= 2
    assert samples[("sbcli_queue_seconds_count", ())] >= samples[("sbcli_compute_seconds_count", ())] >= 1
    assert samples[("sbcli_request_duration_seconds_count", (("endpoint", "/v2/models/{name}/infer"),))] >= 1
    assert samples[("sbcli_model_versions_loaded", ())] == 2
    assert samples[("sbcli_model_version_info", (("default", "true"), ("model", NAME), ("version", "2")))] == 1


def wait_ready(url: str) -> None:
    def ready() -> bool:
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=TIMEOUT) as res:
            return res.status == 200

    wait_until(ready, "the server never became ready", ignoring=(urllib.error.HTTPError,), every_s=0.1)


def test_a_new_step_adds_a_version_under_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    learner = tmp_path / NAME
    make_learner("std", tasks=(3,)).save(learner)
    learner_onnx(learner)
    body = json.dumps({"inputs": [{"name": "image_bytes", "datatype": "BYTES", "shape": [1],
                                   "data": [base64.b64encode(png(3)).decode()]}]}).encode()
    with running(ServeConfig(str(learner), reload_interval_s=0.2, max_wait_ms=2, exporter=EXPORTER)) as (url, server):
        infer, stop, outcomes = f"{url}/v2/models/{NAME}/infer", threading.Event(), []
        wait_ready(url)  # the learner's steps are exported by a child interpreter first (no torch in the server)

        def client() -> None:
            while not stop.is_set():
                status, res = post(infer, body)
                outcomes.append((status, res.get("model_version"), len(res.get("outputs", [{}])[0].get("data", []))))

        threads = [threading.Thread(target=client) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        make_learner("std", tasks=(3, 2)).save(learner)  # step 2, beside step 1
        wait_until(lambda: sorted(server.metrics.versions()) == [(NAME, 1, False), (NAME, 2, True)],
                   "the new step was not added as a version")  # an export: minutes on a loaded machine
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(TIMEOUT)
        assert post(f"{url}/v2/models/{NAME}/versions/1/infer", body)[0] == 200
    assert outcomes and all(status == 200 for status, _, _ in outcomes)
    assert {(v, n) for _, v, n in outcomes} == {("1", 3), ("2", 5)}  # each version answers with its own classes


def test_not_ready_while_a_reload_fails(tmp_path: Path) -> None:
    from sbcli.export import onnx as onnx_export

    model = tmp_path / "model.onnx"
    onnx_export.export_onnx(make_learner("std"), model)
    with running(ServeConfig(str(model), reload_interval_s=0.1)) as (url, server):
        client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=TIMEOUT)
        wait_until(client.is_server_ready, "the server did not become ready")
        assert client.get_model_metadata("model")["versions"] == ["2"]  # the learner step it was exported from
        good = model.read_bytes()
        model.write_bytes(b"not an onnx file")
        wait_until(lambda: server.failing is not None, "the failing reload was not noticed")
        assert client.is_server_live() and not client.is_server_ready() and not client.is_model_ready("model")
        inp = httpclient.InferInput("images", [1, 3, 16, 16], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 3, 16, 16), np.float32))
        assert client.infer("model", [inp]).as_numpy("logits").shape == (1, 5)  # the old model still answers
        model.write_bytes(good)
        wait_until(client.is_server_ready, "the server did not recover")


def test_a_triton_model_folder_serves_each_version(learner_dir: Path, tmp_path: Path) -> None:
    from sbcli import api

    report = api.export_triton(learner_dir, tmp_path / "repo")
    assert report.versions == (1, 2)
    with running(ServeConfig(str(report.model_dir), reload_interval_s=0)) as (url, _):
        client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=TIMEOUT)
        wait_until(client.is_server_ready, "the server did not become ready")
        assert client.get_model_metadata(NAME)["versions"] == ["1", "2"]
        inp = httpclient.InferInput("image_bytes", [1], "BYTES")
        inp.set_data_from_numpy(np.array([png(5)], dtype=object))
        assert client.infer(NAME, [inp], model_version="1").as_numpy("logits").shape == (1, 3)
        assert client.infer(NAME, [inp]).get_response()["model_version"] == "2"


def test_serving_an_onnx_file_imports_no_torch(tmp_path: Path) -> None:
    import subprocess
    import sys

    from sbcli.export import onnx as onnx_export

    model = tmp_path / "model.onnx"
    onnx_export.export_onnx(make_learner("std"), model)
    script = """
import sys, time
from starlette.testclient import TestClient
from sbcli.serve.app import ServeConfig, Server, create_app
server = Server(ServeConfig(sys.argv[1], reload_interval_s=0))
with TestClient(create_app(server)) as client:
    deadline = time.monotonic() + float(sys.argv[2])  # a bound of minutes on the event, not a deadline
    while client.get("/v2/health/ready").status_code != 200:
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.05)
    body = {"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 3, 16, 16], "data": [0.5] * 768}]}
    assert client.post("/v2/models/model/infer", json=body).status_code == 200
    assert client.get("/metrics").status_code == 200
print("torch" in sys.modules, "grpc" in sys.modules)
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    res = subprocess.run([sys.executable, "-c", script, str(model), str(WAIT_S - 60)], check=False, capture_output=True,
                         text=True, timeout=WAIT_S, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "False False"  # neither torch nor grpcio: gRPC loads only with --grpc-port


def test_serving_a_learner_directory_imports_no_torch(learner_dir: Path) -> None:
    """The exporter runs in a child interpreter: the server holds what serving the .onnx holds (858 MiB with torch)."""
    import subprocess
    import sys

    script = """
import sys, time
from starlette.testclient import TestClient
from sbcli.serve.app import ServeConfig, Server, create_app
server = Server(ServeConfig(sys.argv[1], reload_interval_s=0, exporter="sbcli.export.serving"))
with TestClient(create_app(server)) as client:
    deadline = time.monotonic() + float(sys.argv[2])  # a bound of minutes on the event, not a deadline
    while client.get("/v2/health/ready").status_code != 200:
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.05)
    body = {"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 3, 16, 16], "data": [0.5] * 768}]}
    name = client.get("/v2/models").json()["models"][0]["name"]
    assert client.post(f"/v2/models/{name}/infer", json=body).status_code == 200
    assert client.post(f"/v2/models/{name}/versions/1/infer", json=body).status_code == 200
print("torch" in sys.modules)
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    res = subprocess.run([sys.executable, "-c", script, str(learner_dir), str(WAIT_S - 60)], check=False, capture_output=True,
                         text=True, timeout=WAIT_S, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "False"


def test_a_damaged_learner_served_is_still_one_sentence(learner_dir: Path, tmp_path: Path) -> None:
    import shutil

    from sbcli.errors import LearnerError

    broken = tmp_path / "broken"
    shutil.copytree(learner_dir, broken)
    (broken / "learner.json").write_text("{")
    with pytest.raises(LearnerError, match="not valid JSON"):
        learner_onnx(broken)
