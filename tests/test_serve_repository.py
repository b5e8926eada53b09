"""`sb serve REPO`: a Triton model repository of two models (a learner with two kept steps from
`sb export --format triton`, and a plain ONNX file in a model folder of its own) served as Triton
serves it, checked with Triton's own HTTP client: the repository index, model metadata and
configuration, inference (equal to `sb predict`), statistics, load and unload, Triton's metric
names; and several sources on one command line, each by its name."""

from __future__ import annotations

import json
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

httpclient = pytest.importorskip("tritonclient.http")
# ruff: noqa: E402  (the skip above must come before the serving modules are imported)
from learners import make_learner
from test_serve_http import TIMEOUT, call, png, running, wait_until
from tritonclient.utils import InferenceServerException
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.errors import ConfigError
from sbcli.export import onnx as onnx_export
from sbcli.export.serving import EXPORTER, learner_onnx, open_learner
from sbcli.export.triton import TritonConfig, config_text
from sbcli.serve.app import ServeConfig, Server
from sbcli.serve.predict import Prediction, predict

LEARNER, PLAIN = "learner", "plain"


@dataclass
class TwoModels:
    """A learner (two kept steps), a plain ONNX file, the repository holding both, images and `sb predict`'s answers."""

    learner: Path
    plain: Path
    repo: Path
    images: list[Path]
    expected: dict[str, list[Prediction]]  # by model name: `sb predict` on the learner's current step, on the file


def plain_folder(onnx: Path, repo: Path, name: str = PLAIN) -> Path:
    """A Triton model folder holding ``onnx`` as version 1 (what a team's repository holds beside `sb export`'s)."""
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    shutil.copy(onnx, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(config_text(name, 16, 4, TritonConfig(name)))
    return folder


@pytest.fixture(scope="session")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> TwoModels:
    from sbcli import api

    root = tmp_path_factory.mktemp("repository")
    learner = root / LEARNER
    make_learner("std", tasks=(3,)).save(learner)
    make_learner("std", tasks=(3, 2), seed=1).save(learner)
    plain = root / f"{PLAIN}.onnx"
    onnx_export.export_onnx(make_learner("std", tasks=(4,), seed=2), plain)
    repo = root / "model_repository"
    assert api.export_triton(learner, repo).versions == (1, 2)
    plain_folder(plain, repo)
    (root / "images").mkdir()
    images = []
    for i in range(4):
        images.append(root / "images" / f"img{i}.png")
        images[-1].write_bytes(png(10 + i, (16 + 5 * i, 16)))
    expected = {LEARNER: predict(learner, images, top_k=3, open_learner=open_learner).predictions,
                PLAIN: predict(plain, images, top_k=3).predictions}
    return TwoModels(learner, plain, repo, images, expected)


def wait_ready(client) -> None:  # noqa: ANN001
    wait_until(client.is_server_ready, "the server did not become ready", every_s=0.1)


@pytest.fixture(scope="module")
def served(two_models: TwoModels):
    with running(ServeConfig(str(two_models.repo), reload_interval_s=0)) as (url, server):
        client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=TIMEOUT)
        wait_ready(client)
        yield url, client, server


def assert_equal_to_sb_predict(table: np.ndarray, expected: list[Prediction]) -> None:
    """A classification output ("probability:index:label", best first) against `sb predict`'s top labels."""
    for row, want in zip(table, expected, strict=True):
        parts = [(b if isinstance(b, bytes) else str(b).encode()).decode().split(":", 2) for b in row]
        assert [p[2] for p in parts] == want.labels
        np.testing.assert_allclose([float(p[0]) for p in parts], want.probabilities, atol=1e-5)


def assert_probabilities_equal(probs: np.ndarray, expected: list[Prediction]) -> None:
    for row, want in zip(probs, expected, strict=True):
        best = np.argsort(-row, kind="stable")[: len(want.labels)]
        assert [f"class_{i}" for i in best] == want.labels
        np.testing.assert_allclose(row[best], want.probabilities, atol=1e-5)


def test_the_repository_index_lists_every_version_of_every_model(served) -> None:
    url, client, _ = served
    assert client.get_model_repository_index() == [
        {"name": LEARNER, "version": "1", "state": "READY", "reason": ""},
        {"name": LEARNER, "version": "2", "state": "READY", "reason": ""},
        {"name": PLAIN, "version": "1", "state": "READY", "reason": ""}]
    status, listed = call(f"{url}/v2/models")
    assert status == 200 and [(m["name"], m["versions"], m["ready"]) for m in listed["models"]] == [
        (LEARNER, ["1", "2"], True), (PLAIN, ["1"], True)]


def test_metadata_and_configuration_of_each_model(served) -> None:
    from google.protobuf import json_format
    from test_serve_triton import model_config_pb2

    _, client, _ = served
    for name, versions, classes in ((LEARNER, ["1", "2"], 5), (PLAIN, ["1"], 4)):
        meta = client.get_model_metadata(name)
        assert meta["name"] == name and meta["versions"] == versions and meta["platform"] == "onnxruntime_onnx"
        assert {o["name"]: o["shape"] for o in meta["outputs"]} == {"logits": [-1, classes], "probabilities": [-1, classes]}
        config = client.get_model_config(name)
        assert config["name"] == name and config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 64
        assert {i["name"]: (i["data_type"], i["dims"]) for i in config["input"]} == {
            "images": ("TYPE_FP32", [3, 16, 16]), "image_bytes": ("TYPE_STRING", [1])}
        assert {o["name"]: (o["data_type"], o["dims"]) for o in config["output"]} == {
            "logits": ("TYPE_FP32", [classes]), "probabilities": ("TYPE_FP32", [classes])}
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 5000
        assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 128
        parsed = json_format.ParseDict(config, model_config_pb2().ModelConfig())  # Triton's own schema takes it whole
        assert parsed.input[1].reshape.shape == [] and parsed.version_policy.HasField("all")
    assert client.get_model_config(LEARNER, "1")["output"][0]["dims"] == [3]  # each version its own classes
    with pytest.raises(InferenceServerException) as err:
        client.get_model_config("nope")
    assert err.value.status() == "404" and "'learner', 'plain'" in err.value.message()


@pytest.mark.parametrize("name", [LEARNER, PLAIN])
def test_inference_on_each_model_equals_sb_predict(served, two_models: TwoModels, name: str) -> None:
    _, client, server = served
    data = np.array([f.read_bytes() for f in two_models.images], dtype=object)
    inp = httpclient.InferInput("image_bytes", [len(data)], "BYTES")
    inp.set_data_from_numpy(data, binary_data=True)
    result = client.infer(name, [inp], outputs=[httpclient.InferRequestedOutput("probabilities", class_count=3)])
    assert result.get_response()["model_name"] == name
    assert_equal_to_sb_predict(result.as_numpy("probabilities"), two_models.expected[name])
    pre = server.models.served[name].loaded.model.preprocess  # a preprocessed batch, [N, 1] BYTES as Triton sends it
    batch = pre.to_input([pre.decode(f.read_bytes(), f.name) for f in two_models.images])
    tensor = httpclient.InferInput("images", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)
    assert_probabilities_equal(client.infer(name, [tensor]).as_numpy("probabilities"), two_models.expected[name])
    column = httpclient.InferInput("image_bytes", [len(data), 1], "BYTES")
    column.set_data_from_numpy(data.reshape(-1, 1))
    assert_probabilities_equal(client.infer(name, [column]).as_numpy("probabilities"), two_models.expected[name])


def test_predict_names_its_model_when_there_are_several(served, two_models: TwoModels) -> None:
    url, _, _ = served
    image = two_models.images[0].read_bytes()
    status, res = call(f"{url}/predict", image, "image/png")
    assert status == 400 and res["error"] == ("This server serves 2 models ('learner', 'plain'); "
                                              "name one with ?model=NAME.")
    for name in (LEARNER, PLAIN):
        status, res = call(f"{url}/predict?model={name}&top_k=3", image, "image/png")
        want = two_models.expected[name][0]
        assert status == 200 and res["model"] == name
        assert [t["label"] for t in res["predictions"][0]["top"]] == want.labels
        np.testing.assert_allclose([t["probability"] for t in res["predictions"][0]["top"]], want.probabilities, atol=1e-5)
    status, res = call(f"{url}/predict?model=nope", image, "image/png")
    assert status == 404 and "not served here" in res["error"]
    status, health = call(f"{url}/health")
    assert status == 200 and set(health["models"]) == {LEARNER, PLAIN}
    status, meta = call(f"{url}/metadata")
    assert [m["name"] for m in meta["models"]] == [LEARNER, PLAIN] and call(f"{url}/metadata?model=plain")[1]["classes"]


def test_statistics_count_each_request_by_version(served) -> None:
    _, client, _ = served
    before = client.get_inference_statistics(PLAIN)["model_stats"]
    assert [(s["name"], s["version"]) for s in before] == [(PLAIN, "1")]
    inp = httpclient.InferInput("image_bytes", [3], "BYTES")
    inp.set_data_from_numpy(np.array([png(1), png(2), png(3)], dtype=object))
    for _ in range(2):
        client.infer(PLAIN, [inp])
    wrong = httpclient.InferInput("images", [1, 3, 8, 8], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 3, 8, 8), np.float32))
    with pytest.raises(InferenceServerException):
        client.infer(PLAIN, [wrong])
    (after,) = client.get_inference_statistics(PLAIN, "1")["model_stats"]
    (old,) = before
    stats, was = after["inference_stats"], old["inference_stats"]
    assert stats["success"]["count"] == was["success"]["count"] + 2 and stats["fail"]["count"] == was["fail"]["count"] + 1
    assert after["inference_count"] == old["inference_count"] + 6
    assert after["execution_count"] > old["execution_count"] and after["last_inference"] >= old["last_inference"]
    for part in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[part]["count"] == was[part]["count"] + 2 and stats[part]["ns"] > was[part]["ns"], part
    assert sum(b["compute_infer"]["count"] for b in after["batch_stats"]) == after["execution_count"]
    every = client.get_inference_statistics()["model_stats"]
    assert [(s["name"], s["version"]) for s in every] == [(LEARNER, "1"), (LEARNER, "2"), (PLAIN, "1")]
    with pytest.raises(InferenceServerException) as err:
        client.get_inference_statistics(LEARNER, "7")
    assert err.value.status() == "404"


def test_triton_metric_names_agree_with_the_statistics(served) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    url, client, _ = served
    inp = httpclient.InferInput("image_bytes", [2], "BYTES")
    inp.set_data_from_numpy(np.array([png(4), png(5)], dtype=object))
    client.infer(LEARNER, [inp], model_version="1")
    with urllib.request.urlopen(f"{url}/metrics", timeout=TIMEOUT) as res:
        text = res.read().decode()
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert 'nv_inference_request_success{model="learner",version="1"} ' in text  # no _total: a Triton dashboard's name
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    (stats,) = client.get_inference_statistics(LEARNER, "1")["model_stats"]
    labels = (("model", LEARNER), ("version", "1"))
    assert samples[("nv_inference_request_success_total", labels)] == stats["inference_stats"]["success"]["count"] >= 1
    assert samples[("nv_inference_count_total", labels)] == stats["inference_count"] >= 2
    assert samples[("nv_inference_exec_count_total", labels)] == stats["execution_count"] >= 1
    assert samples[("nv_inference_queue_duration_us_total", labels)] == stats["inference_stats"]["queue"]["ns"] // 1000
    assert samples[("nv_inference_compute_infer_duration_us_total", labels)] > 0
    assert samples[("nv_inference_pending_request_count", labels)] == 0
    assert samples[("nv_inference_request_failure_total", (*labels[:1], ("reason", "REJECTED"), labels[1]))] == 0
    assert samples[("sbcli_requests_waiting", ())] == 0


def test_unload_and_load_as_triton_does(two_models: TwoModels, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(two_models.repo / PLAIN, repo / PLAIN)
    with running(ServeConfig(str(repo), reload_interval_s=0, model_control_mode="explicit")) as (url, _):
        client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=TIMEOUT)
        wait_ready(client)
        inp = httpclient.InferInput("image_bytes", [1], "BYTES")
        inp.set_data_from_numpy(np.array([png(6)], dtype=object))
        client.unload_model(PLAIN)
        assert client.get_model_repository_index() == [{"name": PLAIN, "state": "UNAVAILABLE", "reason": "unloaded"}]
        assert not client.is_model_ready(PLAIN) and not client.is_server_ready()
        with pytest.raises(InferenceServerException) as err:
            client.infer(PLAIN, [inp])
        assert err.value.status() == "404" and "is unloaded" in err.value.message()
        client.load_model(PLAIN)
        assert client.is_model_ready(PLAIN) and client.infer(PLAIN, [inp]).as_numpy("logits").shape == (1, 4)
        with pytest.raises(InferenceServerException) as err:
            client.load_model("later")
        assert err.value.status() == "404" and str(repo) in err.value.message()
        plain_folder(two_models.plain, repo, "later")  # a model folder added to the repository after the start
        client.load_model("later")
        client.unload_model(PLAIN)
        status, ready = call(f"{url}/v2/repository/index", json.dumps({"ready": True}).encode(), "application/json")
        assert status == 200 and ready == [{"name": "later", "version": "1", "state": "READY", "reason": ""}]
        client.load_model(PLAIN)
        assert client.infer("later", [inp]).get_response()["model_name"] == "later"
        with pytest.raises(InferenceServerException, match="not supported"):
            client.load_model(PLAIN, config=json.dumps({"max_batch_size": 8}))


def test_several_sources_each_by_name(two_models: TwoModels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    learner_onnx(two_models.learner)  # the export the server does at startup, done first: its start stays quick
    cfg = ServeConfig((str(two_models.plain), str(two_models.learner)), reload_interval_s=0, exporter=EXPORTER)
    with running(cfg) as (url, _):
        client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=TIMEOUT)
        wait_ready(client)
        assert [(e["name"], e["version"]) for e in client.get_model_repository_index()] == [
            (PLAIN, "1"), (LEARNER, "1"), (LEARNER, "2")]
        inp = httpclient.InferInput("image_bytes", [len(two_models.images)], "BYTES")
        inp.set_data_from_numpy(np.array([f.read_bytes() for f in two_models.images], dtype=object))
        for name in (PLAIN, LEARNER):
            out = httpclient.InferRequestedOutput("probabilities", class_count=3)
            assert_equal_to_sb_predict(client.infer(name, [inp], outputs=[out]).as_numpy("probabilities"),
                                       two_models.expected[name])


def test_two_models_of_one_name_are_refused(two_models: TwoModels, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    shutil.copy(two_models.plain, tmp_path / "a" / "learner.onnx")
    with pytest.raises(ConfigError) as err:
        Server(ServeConfig((str(tmp_path / "a" / "learner.onnx"), str(two_models.repo))))
    assert str(err.value) == (f"Two models would be served as 'learner' ({tmp_path / 'a' / 'learner.onnx'} and "
                              f"{two_models.repo / LEARNER}); serve them from folders or files of different names.")


def test_load_and_unload_are_refused_unless_started_in_explicit_mode(two_models: TwoModels) -> None:
    """Triton refuses a client's load and unload unless started with --model-control-mode explicit; so does sb serve."""
    with running(ServeConfig(str(two_models.repo), reload_interval_s=0)) as (url, _):
        client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=TIMEOUT)
        wait_ready(client)
        for act in (client.unload_model, client.load_model):
            with pytest.raises(InferenceServerException) as err:
                act(PLAIN)
            assert err.value.status() == "400" and "--model-control-mode explicit" in err.value.message()
        assert client.is_model_ready(PLAIN) and client.is_server_ready()  # nothing changed
        status, res = call(f"{url}/v2/repository/models/{PLAIN}/unload", b"{}", "application/json")
        assert status == 400 and "not allowed" in res["error"] and client.is_model_ready(PLAIN)


def test_a_model_folder_without_config_pbtxt_is_served_with_a_completed_configuration(two_models: TwoModels,
                                                                                    tmp_path: Path) -> None:
    """Triton completes an ONNX model's configuration when config.pbtxt is absent; before, sb serve skipped the
    folder silently (and refused it alone as "neither a learner directory nor ...")."""
    repo = tmp_path / "repo"
    shutil.copytree(two_models.repo / PLAIN, repo / PLAIN)
    (repo / "bare" / "1").mkdir(parents=True)
    shutil.copy(two_models.plain, repo / "bare" / "1" / "model.onnx")  # no config.pbtxt
    res = CliRunner().invoke(app, ["serve", str(repo / "bare"), "--port", "0", "--metrics-port", "0", "--workers", "0"])
    assert "--workers must be at least 1" in res.output  # the folder alone was accepted as a model: the next check spoke
    with running(ServeConfig(str(repo), reload_interval_s=0)) as (url, _):
        client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=TIMEOUT)
        wait_ready(client)
        assert sorted(m["name"] for m in client.get_model_repository_index()) == ["bare", PLAIN]
        config = client.get_model_config("bare")
        assert config["name"] == "bare" and config["platform"] == "onnxruntime_onnx"
        assert config["output"][0]["dims"] == [4] and config["input"][0]["dims"] == [3, 16, 16]
        inp = httpclient.InferInput("image_bytes", [1], "BYTES")
        inp.set_data_from_numpy(np.array([two_models.images[0].read_bytes()], dtype=object))
        top = client.infer("bare", [inp]).as_numpy("probabilities")[0]
        want = two_models.expected[PLAIN][0]
        assert top.argmax() == int(want.labels[0].rsplit("_", 1)[1])
