"""The serve cache (where `sb serve LEARNER` exports its steps): a read-only home falls back to a folder of one's
own in the temporary folder, an unwritable one is said with what to do in a container, and a learner whose name
is 255 bytes long still has a cache file that fits."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from learners import make_learner

from sbcli.errors import ExportError
from sbcli.serve import cache

LONG_NAME = "é" * 127 + "a"  # 255 bytes of UTF-8: the longest name most file systems allow


@pytest.fixture
def read_only_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$XDG_CACHE_HOME below a file: nothing can be made there, for root too (as on a read-only root file system)."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # for the exporter's child interpreter
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path / "tmp"


def test_a_read_only_cache_falls_back_to_a_folder_of_ones_own(read_only_home: Path) -> None:
    folder = cache.cache_dir()
    assert folder.parent == read_only_home and folder.name.startswith("sbcli-serve-")
    assert folder.stat().st_mode & 0o777 == 0o700


def test_a_temporary_folder_others_may_write_to_is_never_used(read_only_home: Path) -> None:
    shared = cache.own_temp_cache()
    assert shared is not None
    shared.chmod(0o777)  # planted, or made by someone careless: what it holds could be anyone's model
    with pytest.raises(ExportError) as err:
        cache.cache_dir()
    assert cache.CACHE_ENV in str(err.value)


def test_no_writable_cache_says_what_to_do_in_a_container(read_only_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(read_only_home.parent / "not-a-folder" / "tmp"))
    with pytest.raises(ExportError) as err:
        cache.cache_dir()
    sentence = str(err.value)
    assert "SBCLI_SERVE_CACHE" in sentence and "--cache-dir" in sentence and "tmpfs" in sentence
    assert "sb export" not in sentence  # the learner is fine: exporting it would not help


def test_the_cache_named_by_the_environment_is_used_or_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine"
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "file" / "cache"))
    with pytest.raises(ExportError, match=f"{cache.CACHE_ENV} is .*, which cannot be written"):
        cache.cache_dir()


def test_a_cache_file_name_fits_whatever_the_learner_is_called() -> None:
    name = cache.entry_name(LONG_NAME, "step12-0123456789abcdef", ".onnx")
    assert len(name.encode()) <= cache.NAME_BYTES + 40 and name.endswith("-step12-0123456789abcdef.onnx")
    assert cache.entry_name("small", "k", ".onnx") == "small-k.onnx"
    assert cache.entry_name("é" * 60, "k", "").encode().decode() == "é" * 48 + "-k"  # cut on a character boundary


def test_a_learner_named_255_bytes_is_exported_for_serving_on_a_read_only_home(read_only_home: Path,
                                                                               tmp_path: Path) -> None:
    from sbcli.export.serving import learner_onnx

    learner = tmp_path / LONG_NAME
    make_learner("std", tasks=(3,)).save(learner)
    out = learner_onnx(learner)  # in a child interpreter, which reads the same environment
    assert out.is_file() and out.parent.parent == read_only_home and len(out.name.encode()) < 255
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    assert os.access(out, os.R_OK)


def test_a_learner_is_ready_after_its_current_step_and_exports_the_others_on_demand(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cold: only the current step is exported before the server is ready; step 1 on its first request. Warm: the
    same learner served again from the cache starts no interpreter at all (each would import torch)."""
    import json

    from test_serve_http import call, running, wait_until

    from sbcli.export import serving
    from sbcli.export.serving import EXPORTER
    from sbcli.serve.app import ServeConfig

    def listed(url: str) -> list[dict]:
        index = call(f"{url}/v2/repository/index", b"{}", "application/json")[1]
        return index if all("version" in e for e in index) else []  # not while loading

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    learner = tmp_path / "grown"
    make_learner("std", tasks=(3,)).save(learner)
    make_learner("std", tasks=(3, 2), seed=1).save(learner)
    body = json.dumps({"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 3, 16, 16],
                                   "data": [0.5] * 768}]}).encode()
    cfg = ServeConfig(str(learner), reload_interval_s=0, exporter=EXPORTER)
    with running(cfg) as (url, _):
        index = wait_until(lambda: listed(url), "the versions were never listed", every_s=0.1)
        assert [(e["version"], e["state"]) for e in index] == [("1", "UNAVAILABLE"), ("2", "READY")]
        assert "first request" in index[0]["reason"]
        assert call(f"{url}/v2/models/grown")[1]["versions"] == ["1", "2"]
        status, answer = call(f"{url}/v2/models/grown/versions/1/infer", body, "application/json")
        assert status == 200 and answer["model_version"] == "1" and answer["outputs"][0]["shape"] == [1, 3]
        index = call(f"{url}/v2/repository/index", b"{}", "application/json")[1]
        assert [(e["version"], e["state"]) for e in index] == [("1", "READY"), ("2", "READY")]

    def no_interpreter(*args: str) -> None:
        raise AssertionError(f"a warm start exported or listed in a child interpreter: {args}")

    monkeypatch.setattr(serving, "_in_child", no_interpreter)
    with running(cfg) as (url, _):
        index = wait_until(lambda: listed(url), "the versions were never listed", every_s=0.1)
        assert [(e["version"], e["state"]) for e in index] == [("1", "READY"), ("2", "READY")]
        assert call(f"{url}/v2/models/grown/versions/1/infer", body, "application/json")[0] == 200


def test_a_debug_start_says_where_its_time_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """SBCLI_DEBUG=1: the export for serving reports, from its child interpreter, when torch was loaded, the learner
    read, the step traced and checked; and the parent how long the child took (a cache hit: no child at all)."""
    import logging

    from sbcli.export import serving

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    monkeypatch.setenv(serving.DEBUG_ENV, "1")
    learner = tmp_path / "one"
    make_learner("std", tasks=(3,)).save(learner)
    with caplog.at_level(logging.DEBUG, logger="sbcli"):
        exported = serving.learner_onnx(learner)
    lines = [r.getMessage() for r in caplog.records]
    for said in ("torch loaded", "Read the learner", "Traced step 1 to ONNX", "Checked it against PyTorch",
                 "The child interpreter (learner) answered in"):
        assert any(said in line for line in lines), (said, lines)
    assert exported.is_file()
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="sbcli"):
        assert serving.learner_onnx(learner) == exported
    assert [r.getMessage() for r in caplog.records] == [f"The current step of {learner} is in the serve cache: {exported.name}"]
