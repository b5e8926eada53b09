"""Class and file names that are not valid UTF-8 (any bytes but '/' and NUL on Linux) work end to end.

A folder listed as ``b"caf\\xe9"`` is the class ``"caf\\udce9"`` (Python's surrogateescape): the data
layer reads it, the fingerprint hashes its bytes, learner.json and the ONNX metadata write it as
ASCII-escaped JSON and read it back unchanged, and ``os.fsencode`` gives the folder's bytes back.
Hypothesis fuzzes the names over the data layer and a learner's save and load (no training per
example); one test runs the CLI end to end (train, add-task, evaluate, ONNX, push and pull).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import PALETTE, write_class_folder
from fake_hub import FakeHub
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from typer.testing import CliRunner

from sbcli.cli.app import app
from sbcli.data.fingerprint import fingerprint
from sbcli.data.names import shown
from sbcli.data.sources.folder import load_folder
from sbcli.export.onnx import metadata
from sbcli.learner.state import Learner

runner = CliRunner()
EXAMPLES = int(os.environ.get("SBCLI_NAME_EXAMPLES", "15"))

# a file or folder name on Linux: 1-20 bytes, no '/', no NUL, not hidden (a leading '.' is skipped by design)
raw_names = st.binary(min_size=1, max_size=20).filter(lambda b: b"/" not in b and b"\0" not in b
                                                      and not b.startswith(b"."))


@pytest.fixture(scope="module")
def base(one_task_learner: Path) -> Learner:
    return Learner.load(one_task_learner)


def write_png(path: Path, colour: tuple[int, int, int]) -> None:
    Image.fromarray(np.full((4, 4, 3), colour, np.uint8)).save(path, format="PNG")


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(classes=st.lists(raw_names, min_size=2, max_size=2, unique=True), files=st.lists(raw_names, min_size=1, max_size=3))
def test_any_name_survives_the_data_layer_and_a_save_and_load(base: Learner, classes: list[bytes],
                                                             files: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(os.fsencode(tmp), b"train")
        for i, cls in enumerate(classes):
            os.makedirs(os.path.join(root, cls))
            for name in dict.fromkeys(files):
                write_png(Path(os.fsdecode(os.path.join(root, cls, name + b".png"))), list(PALETTE.values())[i])
        report = load_folder(Path(os.fsdecode(root)), 4, cache=None)
        names = report.data.class_names
        assert sorted(os.fsencode(n) for n in names) == sorted(classes)  # lossless: the folders' bytes
        prints = fingerprint(report.data)
        assert len(prints.sha256) == 64 and prints.classes == names
        state = type(base.state)(**{**vars(base.state), "class_names": list(names),
                                    "tasks": [dataclasses.replace(base.state.tasks[0], classes=list(names))]})
        learner = Learner(state, base.model, base.memory, dict(base.extra), base.test_sample)
        learner.save(Path(tmp) / "learner")
        again = Learner.load(Path(tmp) / "learner")
        assert again.state.class_names == names
        (Path(tmp) / "learner" / "learner.json").read_bytes().decode("ascii")  # escaped, plain ASCII JSON
        meta = metadata(again)
        assert json.loads(meta["class_names"]) == names and all(v.encode("utf-8") for v in meta.values())
        assert all(shown(n).encode("utf-8") for n in names)


def test_a_class_folder_that_is_not_utf8_works_end_to_end(fake_hub: FakeHub, tmp_path: Path) -> None:
    data = tmp_path / "data"
    for split, count in (("train", 16), ("test", 6)):
        write_class_folder(data / "t1" / split, ["red", "green"], count)
        write_class_folder(data / "t2" / split, ["blue", "yellow"], count)
        os.rename(data / "t1" / split / "red", os.fsdecode(os.fsencode(data / "t1" / split) + b"/caf\xe9"))
        os.rename(data / "t2" / split / "blue", os.fsdecode(os.fsencode(data / "t2" / split) + b"/na\xefve \xff"))
    learner = tmp_path / "learner"
    small = ["--epochs", "1", "--device", "cpu"]
    res = runner.invoke(app, ["train", str(data / "t1/train"), "--pretrained", "none", "--test", str(data / "t1/test"), "--out", str(learner),
                              "--width", "0.125", "--image-size", "16", "--memory", "8", *small])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["add-task", str(learner), str(data / "t2/train"), "--test", str(data / "t2/test"), *small])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["evaluate", str(learner), "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    names = Learner.load(learner).state.class_names  # in label order (the scenario orders classes by its seed)
    assert json.loads(res.stdout)["classes"] == 4
    assert sorted(names) == ["caf\udce9", "green", "na\udcefve \udcff", "yellow"]
    res = runner.invoke(app, ["export", str(learner), "-o", str(tmp_path / "m.onnx")])
    assert res.exit_code == 0, res.output
    props = {p.key: p.value for p in onnx.load(str(tmp_path / "m.onnx")).metadata_props}
    assert json.loads(props["class_names"]) == names
    assert b"caf\xe9" in [os.fsencode(n) for n in json.loads(props["class_names"])]  # the folder's bytes again
    res = runner.invoke(app, ["export", str(learner), "--to-hub", "tester/names"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["pull", "tester/names", "-o", str(tmp_path / "pulled")])
    assert res.exit_code == 0, res.output
    assert Learner.load(tmp_path / "pulled").state.class_names == names
    card = (tmp_path / "pulled" / "README.md").read_text(encoding="utf-8")
    assert "caf\\xe9" in card and "na\\xefve \\xff" in card
    shutil.rmtree(data)
