"""`sb serve`'s command line: every numeric option finite and in range, the address checked, each
refused in one sentence naming the option before the model loads; a Triton model folder accepted;
the server's log lines short when stderr is not a terminal."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import urllib.error
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn", reason="sb serve's tests need the serving extra (pip install 'sbcli[onnx]')")
# ruff: noqa: E402  (the skip above must come before the serving modules are imported)
from learners import make_learner
from test_serve_http import TIMEOUT, call, free_port, png, renamed, wait_until
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.export import onnx as onnx_export

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("options") / "model.onnx"
    onnx_export.export_onnx(make_learner("std"), out)
    return out


@pytest.fixture
def never_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal must come before the model loads: loading (or serving) here is a failure of the test."""
    from sbcli.serve import app as serve_app
    from sbcli.serve import server

    def loaded(*_: object, **__: object) -> None:
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(serve_app.Server, "load", loaded)
    monkeypatch.setattr(server, "run", loaded)


def refusal(args: list[str]) -> str:
    """The one line `sb serve ARGS` says when it refuses (asserted: exit code, no traceback, one sentence)."""
    res = CliRunner().invoke(app, ["serve", *args])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code != 0, res.output
    assert "Traceback" not in res.output and "bug in sbcli" not in res.output, res.output
    assert len(lines) == 1 and lines[0].startswith("Error: ") and lines[0].endswith("."), res.output
    assert len(lines[0].rstrip(".").split(". ")) == 1, res.output  # one sentence
    return lines[0]


BAD = [
    (["--max-request-mb", "nan"], "--max-request-mb"),
    (["--max-request-mb", "inf"], "--max-request-mb"),
    (["--max-request-mb", "0"], "--max-request-mb"),
    (["--max-image-megapixels", "nan"], "--max-image-megapixels"),
    (["--max-request-megapixels", "inf"], "--max-request-megapixels"),
    (["--max-wait-ms", "nan"], "--max-wait-ms"),
    (["--max-wait-ms", "inf"], "--max-wait-ms"),
    (["--max-wait-ms", "-1"], "--max-wait-ms"),
    (["--reload-interval", "nan"], "--reload-interval"),
    (["--reload-interval", "inf"], "--reload-interval"),
    (["--reload-interval", "-1"], "--reload-interval"),
    (["--threads", "-1"], "--threads"),
    (["--threads", "0"], "--threads"),
    (["--threads", str(CORES + 1)], f"at most {CORES}, the CPU cores this machine has"),
    (["--workers", "0"], "--workers"),
    (["--workers", str(CORES + 1)], f"at most {CORES}, the CPU cores this machine has"),
    (["--port", "70000"], "--port"),
    (["--top-k", "0"], "--top-k"),
    (["--max-images", "0"], "--max-images"),
    (["--max-batch-size", "0"], "--max-batch-size"),
    (["--max-inflight-mb", "nan"], "--max-inflight-mb"),
    (["--max-inflight-mb", "8"], "--max-inflight-mb"),  # below --max-request-mb (16): no full request could be read
    (["--request-timeout", "nan"], "--request-timeout"),
    (["--request-timeout", "0"], "--request-timeout"),
    (["--request-timeout", "inf"], "--request-timeout"),
    (["--max-connections", "0"], "--max-connections"),
    (["--max-connections", "100000000"], "--max-connections"),
    (["--host", "999.1.1.1"], "--host 999.1.1.1"),
    (["--max-queue", "0"], "--max-queue"),
    (["--max-queue", "2000000"], "--max-queue must be between 1 and 1e+06"),
    (["--grpc-port", "0"], "--grpc-port"),
    (["--metrics-port", "70000"], "--metrics-port must be between 0 and 65535"),
    (["--port", "8123", "--metrics-port", "8123"], "--metrics-port must differ from --port (8123)"),
    (["--model-control-mode", "poll"], "--model-control-mode poll is unknown; choose one of: none, explicit"),
    (["--header-timeout", "0"], "--header-timeout"),
    (["--header-timeout", "nan"], "--header-timeout"),
    (["--max-connections-per-client", "0"], "--max-connections-per-client"),
    *[([flag, value], f"{flag} must be") for flag in ("--max-inflight-mb", "--max-request-mb", "--max-image-megapixels",
                                                     "--max-request-megapixels")
      for value in ("1e308", "-1e308", "inf", "-inf", "nan", "-1", "0")],  # 1e308: an OverflowError before
    (["--grpc-port", "70000"], "--grpc-port"),
    (["--port", "8123", "--grpc-port", "8123"], "--grpc-port must differ from --port (8123)"),
]


@pytest.mark.parametrize(("args", "words"), BAD, ids=[" ".join(args) for args, _ in BAD])
def test_every_numeric_option_is_finite_and_in_range(model: Path, never_loads: None, args: list[str], words: str) -> None:
    line = refusal([str(model), "--port", "0", *args])
    assert words in line, line


def test_a_port_already_in_use_is_refused_before_the_model_loads(model: Path, never_loads: None) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refusal([str(model), "--port", str(port)])
    assert f"127.0.0.1:{port}" in line and "--port" in line, line


def test_a_grpc_port_already_in_use_is_refused_before_the_model_loads(model: Path, never_loads: None) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refusal([str(model), "--port", "0", "--grpc-port", str(port)])
    assert f"127.0.0.1:{port}" in line and "--grpc-port" in line, line


def test_two_models_of_one_name_are_refused_before_any_loads(model: Path, tmp_path: Path, never_loads: None) -> None:
    (tmp_path / "a").mkdir()
    shutil.copy(model, tmp_path / "a" / "model.onnx")
    line = refusal([str(model), str(tmp_path / "a" / "model.onnx"), "--port", "0"])
    assert "Two models would be served as 'model'" in line, line


def test_grpc_without_grpcio_is_one_sentence_naming_the_extra(model: Path, never_loads: None,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # as if grpcio were not installed: importing it fails
    line = refusal([str(model), "--port", "0", "--grpc-port", str(free_port())])
    assert '--grpc-port needs grpcio; install the gRPC extra: pip install "sbcli[grpc]"' in line, line


def test_the_defaults_pass_the_checks(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sbcli.serve import server

    served = []
    monkeypatch.setattr(server, "run", lambda srv, listen: served.append((srv, listen)))
    res = CliRunner().invoke(app, ["serve", str(model), "--port", "0", "--metrics-port", str(free_port())])
    assert res.exit_code == 0, res.output
    assert len(served) == 1 and served[0][0].loaded is not None
    cfg = served[0][0].cfg
    assert (cfg.model_control_mode, cfg.header_timeout_s, cfg.per_client) == ("none", 10.0, 64)


def triton_folder(model: Path, root: Path) -> Path:
    """The folder `sb export --format triton` writes for one model: config.pbtxt beside N/model.onnx."""
    folder = root / "repo" / "my-learner"
    (folder / "2").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('name: "my-learner"\nplatform: "onnxruntime_onnx"\n')
    shutil.copy(model, folder / "2" / "model.onnx")
    return folder


def test_cli_serves_a_triton_model_folder(model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sbcli.serve import server

    folder = triton_folder(model, tmp_path)
    served = []
    monkeypatch.setattr(server, "run", lambda srv, listen: served.append(srv))
    res = CliRunner().invoke(app, ["serve", str(folder), "--port", "0", "--metrics-port", "0"])
    assert res.exit_code == 0, res.output
    assert served and served[0].loaded.model.path == folder / "2" / "model.onnx"
    assert "/v2/models/my-learner" in " ".join(res.output.split())
    # the repository above it serves every model folder in it
    res = CliRunner().invoke(app, ["serve", str(folder.parent), "--port", "0", "--metrics-port", "0"])
    assert res.exit_code == 0, res.output
    assert [s.name for s in served[1].models.served.values()] == ["my-learner"]
    # a folder that holds none of them: still one sentence that names them all
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    line = refusal([str(tmp_path / "empty"), "--port", "0"])
    assert "Triton model folder or model repository" in line, line


def serve_process(args: list[str], stderr: Any = subprocess.PIPE, **popen: Any) -> subprocess.Popen:
    """`sb serve ARGS` in a process of its own, stderr not a terminal (a pipe unless told), no COLUMNS set; no
    metrics port unless ARGS names one (Triton's 8002 may be taken on a shared machine)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    args = args if "--metrics-port" in args else [*args, "--metrics-port", "0"]
    env.pop("COLUMNS", None)  # off a terminal with no COLUMNS: what a service manager or a pipe gives
    return subprocess.Popen([sys.executable, "-m", "sbcli", "serve", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=stderr, text=True, **popen)


def wait_healthy(proc: subprocess.Popen, url: str) -> dict:
    return wait_until(lambda: call(f"{url}/health")[1], "sb serve did not start", alive=lambda: proc.poll() is None,
                      ignoring=(urllib.error.URLError, ConnectionError, TimeoutError), every_s=0.2)


def test_log_lines_are_short_when_stderr_is_not_a_terminal(model: Path, tmp_path: Path) -> None:
    """Short, and the user's text in them shown as text: a folder named like markup and escape codes."""
    served = tmp_path / "\x1b[31m[bold red]x[" / "]" / "served.onnx"  # "...x[/]/served.onnx"
    served.parent.mkdir(parents=True)
    served.write_bytes(model.read_bytes())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve_process([str(served), "--port", str(port), "--reload-interval", "0.2"])
    try:
        assert wait_healthy(proc, url)["model_version"] == 1
        os.replace(renamed(model, tmp_path / "next.onnx", "new_"), served)
        wait_until(lambda: call(f"{url}/health")[1]["model_version"] == 2, "the server did not reload")
        assert call(f"{url}/predict", png(0), "image/png")[0] == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=TIMEOUT)
    lines = err.splitlines()
    assert any("Reloaded" in line and "model version 2" in line for line in lines), err[:2000]
    longest = max(len(line) for line in lines)
    assert longest < 400, f"a log line of {longest} characters"  # before: every log line padded to 100,000
    assert not [line for line in lines if line != line.rstrip()]  # no padding at all
    assert "\x1b" not in err and "\x07" not in err, err[:2000]  # the folder's ESC is shown, never sent raw
    assert any("Serving" in line and "\\x1b[31m[bold red]x[/]/served.onnx" in line for line in lines), err[:2000]
    assert any("Reloaded" in line and "\\x1b[31m[bold red]x[/]/served.onnx" in line for line in lines), err[:2000]
