"""GPU options of `sb serve` (CUDA graphs, TensorRT fp16 and engine cache), checked on the CPU: the
provider options handed to onnxruntime, the refusals, the provider printed, and the I/O-bound runner
that CUDA graphs need (run on the CPU without a graph). The real GPU run is marked `gpu`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from learners import make_learner
from test_serve_providers import CPU, CUDA, TRT, FakeOrt
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.errors import ConfigError
from sbcli.export import onnx as onnx_export
from sbcli.serve.gpu import BoundRunner, GpuOptions, bucket
from sbcli.serve.classifier import open_onnx
from sbcli.serve.providers import open_session


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu") / "model.onnx"
    onnx_export.export_onnx(make_learner("std"), out)
    return out


class OptionsOrt(FakeOrt):
    """FakeOrt that also records the provider options it was given."""

    options: list | None = None

    def InferenceSession(self, model, options, providers, provider_options=None):  # noqa: N802
        self.options = provider_options
        return super().InferenceSession(model, options, providers)


def test_provider_options_are_built_per_provider(tmp_path: Path) -> None:
    gpu = GpuOptions(cuda_graph=True, trt_fp16=True, trt_cache=str(tmp_path / "trt"))
    assert gpu.provider_options([TRT, CUDA, CPU]) == [
        {"trt_fp16_enable": "True", "trt_engine_cache_enable": "True", "trt_engine_cache_path": str(tmp_path / "trt"),
         "trt_timing_cache_enable": "True", "trt_timing_cache_path": str(tmp_path / "trt")},
        {"enable_cuda_graph": "1"}, {}]
    assert GpuOptions().provider_options([CUDA, CPU]) == [{}, {}]


def test_the_provider_that_ran_is_named_with_its_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    gpu = GpuOptions(trt_fp16=True)
    ort = OptionsOrt([TRT, CUDA, CPU], {TRT, CUDA, CPU})
    _, chosen = open_session(Path("m.onnx"), "tensorrt", ort=ort, gpu=gpu)
    assert chosen == "tensorrt" and ort.options[0]["trt_fp16_enable"] == "True" and ort.options[1] == {}
    assert gpu.describe(chosen) == f"tensorrt (fp16, engine cache {tmp_path / 'sbcli' / 'serve' / 'tensorrt'})"
    fallback = OptionsOrt([TRT, CUDA, CPU], {CPU})  # onnxruntime-gpu without a usable GPU: auto falls back, and says so
    _, chosen = open_session(Path("m.onnx"), "auto", ort=fallback, gpu=gpu)
    assert chosen == "cpu" and gpu.describe(chosen) == "cpu"
    assert GpuOptions(cuda_graph=True).describe("cuda") == "cuda (CUDA graphs)"


def test_options_a_provider_would_not_use_are_refused() -> None:
    with pytest.raises(ConfigError, match="add --provider cuda"):
        GpuOptions(cuda_graph=True).check("auto")
    with pytest.raises(ConfigError, match="apply to the TensorRT provider"):
        GpuOptions(trt_fp16=True).check("cpu")
    GpuOptions(trt_fp16=True).check("auto")
    GpuOptions(cuda_graph=True).check("cuda")


def test_cli_refuses_gpu_options_in_one_sentence(model: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["serve", str(model), "--cuda-graph"])
    assert res.exit_code == 1 and "--cuda-graph runs on the CUDA provider; add --provider cuda." in " ".join(res.output.split())
    res = runner.invoke(app, ["serve", str(model), "--provider", "cpu", "--trt-fp16"])
    assert res.exit_code == 1 and "apply to the TensorRT provider" in res.output
    if CUDA not in onnxruntime.get_available_providers():
        res = runner.invoke(app, ["serve", str(model), "--provider", "cuda", "--cuda-graph"])
        assert res.exit_code == 1 and "--provider cuda is not available" in res.output


def test_batches_run_in_power_of_two_buckets() -> None:
    assert [bucket(n, 64) for n in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64]
    assert bucket(48, 40) == 48 and bucket(20, 24) == 24


def test_bound_runner_on_the_cpu_equals_session_run(model: Path) -> None:
    plain = open_onnx(model, "cpu")
    runner = BoundRunner(plain.session, plain.meta.input_name, plain.meta.output_name, device="cpu", graphs=False)
    rng = np.random.default_rng(0)
    for n in (1, 3, 5, 3, 64):
        images = rng.random((n, 3, 16, 16), dtype=np.float32)
        np.testing.assert_allclose(runner.scores(images, 5), plain.scores(images), rtol=1e-5, atol=1e-6)
    assert sorted(runner._bound) == [1, 4, 8, 64]  # one buffer set per bucket, reused


@pytest.mark.gpu
def test_cuda_graphs_equal_the_cuda_provider(model: Path) -> None:
    if CUDA not in onnxruntime.get_available_providers():
        pytest.skip("needs onnxruntime-gpu on a machine with an NVIDIA GPU")
    graphs = open_onnx(model, "cuda", gpu=GpuOptions(cuda_graph=True))
    plain = open_onnx(model, "cuda")
    assert graphs.provider == "cuda (CUDA graphs)" and graphs.runner is not None
    rng = np.random.default_rng(0)
    for n in (1, 3, 64, 3):
        images = rng.random((n, 3, 16, 16), dtype=np.float32)
        np.testing.assert_allclose(graphs.scores(images), plain.scores(images), rtol=1e-3, atol=1e-3)
