"""A learner or an output whose name is as long as the file system allows (255 bytes) exports and pulls: the
hidden temporary and staging names sbcli makes beside it fit wherever the final name fits."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from test_learner import ZOO_V1
from test_store_cli import invoke

from sbcli.atomic import NAME_MAX, fitted, replacing, staging

LONG = "L" * 255
LONG_UTF8 = "é" * 127 + "x"  # 255 bytes in UTF-8, 128 characters


def long_learner(tmp_path: Path, name: str = LONG) -> Path:
    learner = tmp_path / name
    shutil.copytree(ZOO_V1, learner)
    return learner


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("name", [LONG, LONG_UTF8, "." + "h" * 254], ids=["ascii", "utf8", "hidden"])
def test_sbclis_own_names_fit_where_the_final_name_fits(tmp_path, name):
    target = tmp_path / name
    assert len(os.fsencode(target.name)) == NAME_MAX
    with replacing(target) as tmp:
        assert len(os.fsencode(tmp.name)) <= NAME_MAX and tmp.name.startswith(".")
        tmp.write_text("x")
    assert target.read_text() == "x"
    with staging(tmp_path / "out", "pull") as short, staging(target, "pull") as work:
        assert len(os.fsencode(work.parent.name)) <= NAME_MAX and work.parent.name.startswith(".")
        assert short.parent.name.startswith(".out.pull-")  # a name that fits keeps the final name in front
        work.mkdir()
        os.replace(work, tmp_path / "moved")
    assert set(leftovers(tmp_path)) <= {name} and fitted("a", ".b") == "a.b"


def test_an_onnx_export_to_a_255_byte_file(tmp_path):
    out = tmp_path / ("o" * 250 + ".onnx")
    res = invoke("export", long_learner(tmp_path), "-o", out)
    assert res.exit_code == 0, res.output
    assert out.stat().st_size > 0 and leftovers(tmp_path) == []


def test_a_255_byte_learner_exports_to_triton(tmp_path):
    repo = tmp_path / "repo"
    res = invoke("export", long_learner(tmp_path), "--format", "triton", "-o", repo)
    assert res.exit_code == 0, res.output
    assert (repo / LONG / "config.pbtxt").is_file() and leftovers(repo) == []


def test_an_int8_export_to_a_255_byte_file(tmp_path):
    out = tmp_path / ("i" * 250 + ".onnx")
    res = invoke("export", long_learner(tmp_path, "tiny"), "--int8", "--int8-min-agreement", "0", "-o", out)
    assert res.exit_code == 0, res.output
    assert out.stat().st_size > 0 and leftovers(tmp_path) == []


def test_a_pull_into_a_255_byte_folder(tmp_path):
    res = invoke("pull", "demo-sb-tiny", "-o", tmp_path / LONG)
    assert res.exit_code == 0, res.output
    assert (tmp_path / LONG / "learner.json").is_file() and leftovers(tmp_path) == []
