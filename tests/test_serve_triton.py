"""`sb export --format triton`: a Triton model repository whose config.pbtxt parses with the
protobuf schema tritonclient ships and matches the ONNX graph; files 0644, folders 0755."""

from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest
from learners import make_learner
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.serve.classifier import open_onnx

ONNX_TO_TRITON = {onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.FLOAT16: "TYPE_FP16"}


def model_config_pb2() -> ModuleType:
    """tritonclient's generated schema, loaded by file (its package __init__ would need grpcio)."""
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("tritonclient is not installed (pip install tritonclient): its config schema checks config.pbtxt")
    path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    if not path.is_file():
        pytest.skip(f"this tritonclient ships no {path.name}")
    module_spec = importlib.util.spec_from_file_location("sbcli_test_model_config_pb2", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value_info.type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("triton")
    make_learner("std").save(root / "my learner")
    old = os.umask(0o022)
    try:
        res = CliRunner().invoke(app, ["export", str(root / "my learner"), "--format", "triton", "-o", str(root / "repo")])
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    assert "serve it with tritonserver --model-repository=" in " ".join(res.stdout.split())
    return root, root / "repo"


def test_repository_layout_and_modes(repository: tuple[Path, Path]) -> None:
    _, repo = repository
    model_dir = repo / "my-learner"
    found = sorted(str(p.relative_to(repo)) for p in repo.rglob("*"))
    # versions are learner steps: this learner was saved once, after its second step
    assert found == ["my-learner", "my-learner/2", "my-learner/2/model.onnx", "my-learner/config.pbtxt", "my-learner/labels.txt"]
    assert (model_dir / "labels.txt").read_text().splitlines() == [f"class_{i}" for i in range(5)]
    for path in [repo, *repo.rglob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o644), path
    assert open_onnx(model_dir / "2" / "model.onnx").class_names == [f"class_{i}" for i in range(5)]


def test_config_parses_with_tritons_schema_and_matches_the_graph(repository: tuple[Path, Path]) -> None:
    from google.protobuf import text_format

    pb2 = model_config_pb2()
    _, repo = repository
    config = text_format.Parse((repo / "my-learner" / "config.pbtxt").read_text(), pb2.ModelConfig())
    graph = onnx.load(str(repo / "my-learner" / "2" / "model.onnx")).graph
    assert config.name == "my-learner" and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size >= 1 and config.HasField("dynamic_batching")
    assert config.version_policy.HasField("all")  # every kept step is served
    assert [i.name for i in config.input] == [i.name for i in graph.input]
    assert [o.name for o in config.output] == [o.name for o in graph.output]
    for ours, theirs in [*zip(config.input, graph.input, strict=True), *zip(config.output, graph.output, strict=True)]:
        assert pb2.DataType.Name(ours.data_type) == ONNX_TO_TRITON[theirs.type.tensor_type.elem_type]
        shape = dims(theirs)
        assert isinstance(shape[0], str)  # the dynamic batch axis, which Triton adds itself
        assert list(ours.dims) == shape[1:]
    assert config.input[0].format == pb2.ModelInput.FORMAT_NCHW
    assert config.output[0].label_filename == "labels.txt"
    labels = (repo / "my-learner" / config.output[0].label_filename).read_text().splitlines()
    assert len(labels) == config.output[0].dims[0]


def test_an_existing_model_folder_is_refused_unchanged(repository: tuple[Path, Path]) -> None:
    root, repo = repository
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    res = CliRunner().invoke(app, ["export", str(root / "my learner"), "--format", "triton", "-o", str(repo)])
    assert res.exit_code == 1 and "already exists" in res.output
    assert {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()} == before
    assert not [p for p in repo.iterdir() if p.name.startswith(".")]


def test_half_repository_keeps_float32_io(tmp_path: Path) -> None:
    make_learner("std").save(tmp_path / "learner")
    res = CliRunner().invoke(app, ["export", str(tmp_path / "learner"), "--format", "triton", "--half", "-o",
                                   str(tmp_path / "repo"), "--json"])
    assert res.exit_code == 0, res.output
    model = open_onnx(tmp_path / "repo" / "learner" / "2" / "model.onnx")
    assert model.meta.raw["precision"] == "float16"
    scores = model.scores(np.random.default_rng(0).random((2, 3, 16, 16), dtype=np.float32))
    assert scores.dtype == np.float32 and scores.shape == (2, 5)
    assert "TYPE_FP32" in (tmp_path / "repo" / "learner" / "config.pbtxt").read_text()


def test_every_kept_step_is_a_version(tmp_path: Path) -> None:
    from google.protobuf import text_format

    learner = tmp_path / "learner"
    make_learner("std", tasks=(3,)).save(learner)
    make_learner("std", tasks=(3, 2)).save(learner)
    res = CliRunner().invoke(app, ["export", str(learner), "--format", "triton", "-o", str(tmp_path / "repo"), "--json"])
    assert res.exit_code == 0, res.output
    model_dir = tmp_path / "repo" / "learner"
    assert sorted(p.name for p in model_dir.iterdir() if p.is_dir()) == ["1", "2"]
    assert [len(open_onnx(model_dir / v / "model.onnx").class_names) for v in ("1", "2")] == [3, 5]
    pb2 = model_config_pb2()
    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), pb2.ModelConfig())
    assert list(config.output[0].dims) == [-1]  # 3 classes in version 1, 5 in version 2
    labels = (model_dir / "labels.txt").read_text().splitlines()
    assert open_onnx(model_dir / "1" / "model.onnx").class_names == labels[:3]  # one labels file for all versions
