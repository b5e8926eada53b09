"""Provider choice: `auto` takes the best provider that loads (TensorRT, CUDA, CPU); an explicit one
that is missing or does not load is one sentence; onnxruntime and onnxruntime-gpu installed
together is one sentence. The real CUDA and TensorRT paths run only where they exist."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnxruntime
import pytest
from learners import make_learner
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.errors import ConfigError, ExportError
from sbcli.export import onnx as onnx_export
from sbcli.serve import providers
from sbcli.serve.classifier import open_onnx

TRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"


@dataclass
class FakeOrt:
    """onnxruntime with chosen providers available (listed) and loadable (really registered)."""

    available: list[str]
    loads: set[str]
    asked: list[list[str]] = field(default_factory=list)

    def get_available_providers(self) -> list[str]:
        return list(self.available)

    def set_default_logger_severity(self, level: int) -> None:
        pass

    class SessionOptions:
        log_severity_level = 2
        intra_op_num_threads = 0

    def InferenceSession(self, model: str, options: object, providers: list[str]) -> object:  # noqa: N802
        self.asked.append(providers)
        loaded = [p for p in providers if p in self.loads] or [CPU]

        class Session:
            def get_providers(self) -> list[str]:
                return loaded

        return Session()


@pytest.mark.parametrize(("available", "loads", "chosen"), [
    ([TRT, CUDA, CPU], {TRT, CUDA, CPU}, "tensorrt"),
    ([TRT, CUDA, CPU], {CUDA, CPU}, "cuda"),  # TensorRT listed but its libraries are missing
    ([TRT, CUDA, CPU], {CPU}, "cpu"),  # onnxruntime-gpu on a machine without a GPU
    ([CUDA, CPU], {CUDA, CPU}, "cuda"),
    ([CPU], {CPU}, "cpu"),
    (["OpenVINOExecutionProvider", CPU], {CPU}, "cpu"),
])
def test_auto_picks_the_best_provider_that_loads(available: list[str], loads: set[str], chosen: str) -> None:
    ort = FakeOrt(available, loads)
    _, name = providers.open_session(Path("m.onnx"), "auto", ort=ort)
    assert name == chosen
    assert ort.asked[-1] == [p for p in (TRT, CUDA, CPU) if p in available]  # best first, only those listed


def test_explicit_providers_never_fall_back_silently() -> None:
    with pytest.raises(ExportError, match=r"--provider cuda is not available in this onnxruntime \(it has: cpu\)"):
        providers.open_session(Path("m.onnx"), "cuda", ort=FakeOrt([CPU], {CPU}))
    with pytest.raises(ExportError, match="--provider tensorrt is installed but did not load"):
        providers.open_session(Path("m.onnx"), "tensorrt", ort=FakeOrt([TRT, CUDA, CPU], {CUDA, CPU}))
    ort = FakeOrt([TRT, CUDA, CPU], {CUDA, CPU})
    assert providers.open_session(Path("m.onnx"), "cuda", ort=ort)[1] == "cuda" and ort.asked[-1] == [CUDA, CPU]
    assert providers.open_session(Path("m.onnx"), "cpu", ort=ort)[1] == "cpu" and ort.asked[-1] == [CPU]
    with pytest.raises(ConfigError, match="--provider rocm is unknown"):
        providers.candidates("rocm", [CPU])


def test_both_runtimes_installed_is_one_sentence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    providers.check_runtimes(["onnxruntime"])
    providers.check_runtimes(["onnxruntime-gpu"])
    with pytest.raises(ExportError, match="Both onnxruntime and onnxruntime-gpu are installed"):
        providers.check_runtimes(["onnxruntime", "onnxruntime-gpu"])
    monkeypatch.setattr(providers, "installed_runtimes", lambda: ["onnxruntime", "onnxruntime-gpu"])
    (tmp_path / "m.onnx").write_bytes(b"x")
    (tmp_path / "a.png").write_bytes(b"x")
    res = CliRunner().invoke(app, ["predict", str(tmp_path / "m.onnx"), str(tmp_path / "a.png")])
    assert res.exit_code == 1 and "never both" in res.output and len(res.output.strip().splitlines()) <= 3


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prov") / "model.onnx"
    onnx_export.export_onnx(make_learner("std"), out)
    return out


def test_cpu_provider_runs_here(model: Path) -> None:
    assert open_onnx(model, "cpu").provider == "cpu"
    assert open_onnx(model, "auto").provider in ("tensorrt", "cuda", "cpu")


@pytest.mark.parametrize("name", ["cuda", "tensorrt"])
def test_gpu_providers_where_present(model: Path, name: str) -> None:
    if providers.PROVIDERS[name] not in onnxruntime.get_available_providers():
        pytest.skip(f"this onnxruntime has no {name} provider (install sbcli[onnx-gpu] on a GPU machine)")
    try:
        classifier = open_onnx(model, name)
    except ExportError as err:
        pytest.skip(f"the {name} provider is installed but does not load here: {err}")
    import numpy as np

    x = np.random.default_rng(0).random((4, 3, 16, 16), dtype=np.float32)
    cpu = open_onnx(model, "cpu").scores(x)
    assert classifier.provider == name
    np.testing.assert_allclose(classifier.scores(x), cpu, atol=1e-2 * max(1.0, float(np.abs(cpu).max())), rtol=0)


def test_extras_install_one_runtime_each() -> None:
    """`onnx` (CPU) and `onnx-gpu` each bring one onnxruntime and the server; `all` never mixes them."""
    import tomllib

    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def names(extra: str) -> set[str]:
        return {dep.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip() for dep in extras[extra]}

    assert "onnxruntime" in names("onnx") and "onnxruntime-gpu" not in names("onnx")
    assert "onnxruntime-gpu" in names("onnx-gpu") and "onnxruntime" not in names("onnx-gpu")
    for extra in ("onnx", "onnx-gpu"):
        assert {"onnx", "onnxscript", "starlette", "uvicorn", "python-multipart"} <= names(extra)
    assert not any("onnx-gpu" in dep for dep in extras["all"])
