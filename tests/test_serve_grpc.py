"""`sb serve --grpc-port`: the Open Inference Protocol over gRPC (Triton's `inference.GRPCInferenceService`),
checked with Triton's own gRPC client on the repository of two models that test_serve_repository
serves over HTTP: every answer equal to HTTP's, inference equal to `sb predict`, the same limits."""

from __future__ import annotations


import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
# ruff: noqa: E402  (the skip above must come before the serving modules are imported)
import grpc
import tritonclient.http as httpclient
from google.protobuf import json_format
from test_serve_http import TIMEOUT, free_port, png, running, wait_until
from test_serve_repository import (
    LEARNER,
    PLAIN,
    TwoModels,
    assert_equal_to_sb_predict,
    assert_probabilities_equal,
    two_models,  # noqa: F401  (the session's models)
    wait_ready,
)
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from sbcli.serve.app import ServeConfig


@pytest.fixture(scope="module")
def served(two_models: TwoModels):  # noqa: F811
    port = free_port()
    cfg = ServeConfig(str(two_models.repo), reload_interval_s=0, max_images=8, grpc_listen=f"127.0.0.1:{port}",
                      model_control_mode="explicit")
    with running(cfg) as (url, server):
        http = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=TIMEOUT)
        wait_ready(http)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield client, http, service_pb2_grpc.GRPCInferenceServiceStub(channel), server
        client.close()


def test_health_metadata_configuration_and_index_equal_http(served) -> None:
    client, http, _, _ = served
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata(as_json=True)["extensions"] == http.get_server_metadata()["extensions"]
    for name in (LEARNER, PLAIN):
        assert client.is_model_ready(name)
        meta, want = client.get_model_metadata(name, as_json=True), http.get_model_metadata(name)
        assert meta["name"] == want["name"] and meta["versions"] == want["versions"] and meta["platform"] == want["platform"]
        assert [(i["name"], i["datatype"], [int(d) for d in i["shape"]]) for i in meta["inputs"]] == [
            (i["name"], i["datatype"], i["shape"]) for i in want["inputs"]]
        config = client.get_model_config(name).config
        assert config == json_format.ParseDict(http.get_model_config(name), model_config_pb2.ModelConfig())
    assert client.get_model_config(LEARNER, "1").config.output[0].dims == [3]
    assert not client.is_model_ready("nope") and not client.is_model_ready(LEARNER, "9")
    index = client.get_model_repository_index(as_json=True)["models"]
    assert [{"reason": "", **e} for e in index] == http.get_model_repository_index()


@pytest.mark.parametrize("name", [LEARNER, PLAIN])
def test_inference_equals_http_and_sb_predict(served, two_models: TwoModels, name: str) -> None:  # noqa: F811
    client, http, _, server = served
    data = np.array([f.read_bytes() for f in two_models.images], dtype=object)
    inp = grpcclient.InferInput("image_bytes", [len(data)], "BYTES")
    inp.set_data_from_numpy(data)
    result = client.infer(name, [inp], outputs=[grpcclient.InferRequestedOutput("probabilities", class_count=3)],
                          request_id="g1")
    assert result.get_response().model_name == name and result.get_response().id == "g1"
    assert_equal_to_sb_predict(result.as_numpy("probabilities"), two_models.expected[name])
    pre = server.models.served[name].loaded.model.preprocess
    batch = pre.to_input([pre.decode(f.read_bytes(), f.name) for f in two_models.images])
    tensor = grpcclient.InferInput("images", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch)
    logits = client.infer(name, [tensor]).as_numpy("logits")
    over_http = httpclient.InferInput("images", list(batch.shape), "FP32")
    over_http.set_data_from_numpy(batch)
    np.testing.assert_array_equal(logits, http.infer(name, [over_http]).as_numpy("logits"))
    assert_probabilities_equal(client.infer(name, [tensor]).as_numpy("probabilities"), two_models.expected[name])


def test_typed_contents_are_read_like_raw_ones(served, two_models: TwoModels) -> None:  # noqa: F811
    _, _, stub, server = served
    pre = server.models.served[PLAIN].loaded.model.preprocess
    batch = pre.to_input([pre.decode(f.read_bytes(), f.name) for f in two_models.images])
    request = service_pb2.ModelInferRequest(model_name=PLAIN)
    tensor = request.inputs.add(name="images", datatype="FP32", shape=list(batch.shape))
    tensor.contents.fp32_contents.extend(batch.reshape(-1).tolist())
    response = stub.ModelInfer(request, timeout=TIMEOUT)
    assert [o.name for o in response.outputs] == ["logits", "probabilities"] and response.model_version == "1"
    probs = np.frombuffer(response.raw_output_contents[1], "<f4").reshape(len(batch), 4)
    assert_probabilities_equal(probs, two_models.expected[PLAIN])
    encoded = service_pb2.ModelInferRequest(model_name=PLAIN)
    image = encoded.inputs.add(name="image_bytes", datatype="BYTES", shape=[1])
    image.contents.bytes_contents.append(two_models.images[0].read_bytes())
    encoded.outputs.add(name="probabilities").parameters["classification"].int64_param = 3
    raw = stub.ModelInfer(encoded, timeout=TIMEOUT).raw_output_contents[0]
    first = raw[4 : 4 + int.from_bytes(raw[:4], "little")].decode()
    assert first.split(":", 2)[2] == two_models.expected[PLAIN][0].labels[0]


def test_refusals_are_grpc_codes_with_the_http_sentence(served) -> None:
    client, http, stub, _ = served
    ok = grpcclient.InferInput("images", [1, 3, 16, 16], "FP32")
    ok.set_data_from_numpy(np.zeros((1, 3, 16, 16), np.float32))
    small = grpcclient.InferInput("images", [1, 3, 8, 8], "FP32")
    small.set_data_from_numpy(np.zeros((1, 3, 8, 8), np.float32))
    many = grpcclient.InferInput("images", [9, 3, 16, 16], "FP32")
    many.set_data_from_numpy(np.zeros((9, 3, 16, 16), np.float32))
    cases = [("nope", ok, "StatusCode.NOT_FOUND", "not served here"),
             (PLAIN, small, "StatusCode.INVALID_ARGUMENT", "must have shape [N, 3, 16, 16]"),
             (PLAIN, many, "StatusCode.RESOURCE_EXHAUSTED", "more than the 8 this server accepts")]
    for name, inp, code, words in cases:
        with pytest.raises(InferenceServerException) as err:
            client.infer(name, [inp])
        assert err.value.status() == code and words in err.value.message(), err.value
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata(LEARNER, "9")
    assert err.value.status() == "StatusCode.NOT_FOUND" and "versions: 1, 2" in err.value.message()
    broken = service_pb2.ModelInferRequest(model_name=PLAIN)
    broken.inputs.add(name="images", datatype="FP32", shape=[1, 3, 16, 16])
    broken.raw_input_contents.append(b"\0" * 10)
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(broken, timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "needs 3072" in err.value.details()
    huge = service_pb2.ModelInferRequest(model_name=PLAIN)  # past --max-request-mb: refused by gRPC itself
    huge.inputs.add(name="image_bytes", datatype="BYTES", shape=[1])
    huge.raw_input_contents.append(b"\0" * (17 * 2**20))
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(huge, timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert client.infer(PLAIN, [ok]).as_numpy("logits").shape == (1, 4)  # and the server goes on


def test_statistics_over_grpc_equal_http(served) -> None:
    client, http, _, _ = served
    inp = grpcclient.InferInput("image_bytes", [2], "BYTES")
    inp.set_data_from_numpy(np.array([png(7), png(8)], dtype=object))
    before = client.get_inference_statistics(LEARNER, "2").model_stats[0]
    client.infer(LEARNER, [inp])
    after = client.get_inference_statistics(LEARNER, "2").model_stats[0]
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    assert after.inference_count == before.inference_count + 2 and after.last_inference >= before.last_inference
    def agreeing() -> tuple:  # nothing runs between the two reads: they agree (a read that raced a request is read again)
        grpc_stats = client.get_inference_statistics()
        http_stats = json_format.ParseDict(http.get_inference_statistics(), service_pb2.ModelStatisticsResponse())
        return (grpc_stats, http_stats) if grpc_stats == http_stats else ()

    grpc_stats, http_stats = wait_until(agreeing, "the statistics over gRPC and HTTP never agreed")
    assert grpc_stats == http_stats and [(s.name, s.version) for s in grpc_stats.model_stats] == [
        (LEARNER, "1"), (LEARNER, "2"), (PLAIN, "1")]


def test_unload_and_load_over_grpc(served) -> None:
    client, http, _, _ = served
    client.unload_model(PLAIN)
    try:
        assert not client.is_model_ready(PLAIN) and not http.is_model_ready(PLAIN)
        entry = [e for e in client.get_model_repository_index().models if e.name == PLAIN]
        assert [(e.state, e.reason) for e in entry] == [("UNAVAILABLE", "unloaded")]
    finally:
        client.load_model(PLAIN)
    assert client.is_model_ready(PLAIN) and client.is_server_ready()


def test_grpc_requests_are_in_the_metrics(served) -> None:
    _, _, _, server = served
    text = server.metrics.render()[0].decode()
    assert 'sbcli_requests_total{endpoint="grpc:ModelInfer",status="200"}' in text
    assert 'sbcli_request_failures_total{endpoint="grpc:ModelInfer",status="404"}' in text
