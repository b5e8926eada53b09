"""`sb predict`: a learner and its ONNX export give the same top-k answers, read with the right labels."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from learners import SIZE, make_learner
from PIL import Image
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.errors import ConfigError, DataError, ExportError

NAMES = [f"class_{i}" for i in range(5)]  # make_learner()'s classes: two tasks of 3 and 2, random weights and statistics


def write_images(folder: Path, count: int, seed: int, size: tuple[int, int] = (SIZE, SIZE), mode: str = "RGB") -> list[Path]:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        pixels = rng.integers(0, 256, (size[1], size[0], len(mode)), dtype=np.uint8)
        paths.append(folder / f"img{i:02d}.png")
        Image.fromarray(pixels, mode=mode).save(paths[-1])
    return paths


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("served")
    make_learner().save(root / "learner")
    api.export_onnx(root / "learner", root / "model.onnx")
    write_images(root / "images", 5, seed=1)
    write_images(root / "images" / "nested", 3, seed=2, size=(40, 28), mode="RGBA")  # resized, alpha dropped
    (root / "images" / "notes.txt").write_text("not an image")  # skipped when a folder is searched
    return {"root": root, "learner": root / "learner", "onnx": root / "model.onnx", "images": root / "images"}


def test_learner_and_onnx_give_the_same_answers(served) -> None:
    by_learner = api.predict(served["learner"], [served["images"]], top_k=5, device="cpu")
    by_onnx = api.predict(served["onnx"], [served["images"]], top_k=5)
    assert [p.image for p in by_learner] == [p.image for p in by_onnx]
    assert len(by_onnx) == 8 and by_onnx[-1].image.endswith("nested/img02.png")
    for a, b in zip(by_learner, by_onnx, strict=True):
        assert a.labels == b.labels
        np.testing.assert_allclose(a.probabilities, b.probabilities, atol=1e-5)
        assert sorted(b.labels) == sorted(NAMES)
        assert b.probabilities == sorted(b.probabilities, reverse=True)
        assert math.isclose(sum(b.probabilities), 1.0, abs_tol=1e-6)


def test_labels_come_from_the_metadata_in_label_order(tmp_path: Path) -> None:
    """A head that always says class 3 with logit ln 9: every image is NAMES[3] with p = 9 / (9 + 4)."""
    learner = make_learner(seed=4)
    with torch.no_grad():
        learner.model.head.weight.zero_()
        learner.model.head.bias.copy_(torch.tensor([0.0, 0.0, 0.0, math.log(9.0), 0.0]))
    learner.save(tmp_path / "learner")
    api.export_onnx(tmp_path / "learner", tmp_path / "owl.onnx")
    images = write_images(tmp_path / "img", 3, seed=5)
    for model in (tmp_path / "learner", tmp_path / "owl.onnx"):
        predictions = api.predict(model, images, top_k=2, device="cpu")
        assert [p.labels[0] for p in predictions] == [NAMES[3]] * 3
        for p in predictions:
            assert p.probabilities[0] == pytest.approx(9 / 13, abs=1e-5)
            assert p.probabilities[1] == pytest.approx(1 / 13, abs=1e-5)


def test_top_k_is_capped_at_the_number_of_classes(served) -> None:
    (first, *_) = api.predict(served["onnx"], [served["images"] / "img00.png"], top_k=50)
    assert len(first.labels) == len(NAMES)


def test_cli_json_and_table(served) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["predict", str(served["onnx"]), str(served["images"] / "img00.png"), "--json", "-k", "2"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert (report["kind"], report["provider"], report["model"]) == ("onnx", "cpu", str(served["onnx"]))
    (entry,) = report["predictions"]
    assert entry["image"].endswith("img00.png") and len(entry["top"]) == 2
    assert entry["top"][0]["label"] in NAMES and 0 < entry["top"][0]["probability"] <= 1
    res = runner.invoke(app, ["predict", str(served["learner"]), str(served["images"]), "--device", "cpu"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "img00.png" in res.stdout and "top 3 of 8 images (provider pytorch-cpu)" in res.stdout
    assert any(name in res.stdout for name in NAMES)
    res = runner.invoke(app, ["predict", str(served["onnx"]), str(served["images"])], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "(provider cpu)" in res.stdout


def test_batches_give_the_same_answers_as_one_run(served) -> None:
    """Batch size changes how many images go through onnxruntime at once, never the answers."""
    whole = api.predict(served["onnx"], [served["images"]], top_k=5, batch_size=64)
    batched = api.predict(served["onnx"], [served["images"]], top_k=5, batch_size=3)
    assert [p.image for p in whole] == [p.image for p in batched] and len(whole) == 8
    for a, b in zip(whole, batched, strict=True):
        assert a.labels == b.labels
        np.testing.assert_allclose(a.probabilities, b.probabilities, atol=1e-6)


def test_predict_on_an_onnx_file_imports_neither_torch_nor_the_api(served) -> None:
    """`sb predict model.onnx` runs on numpy, Pillow and onnxruntime alone (it starts fast)."""
    code = ("import sys, runpy; sys.argv = ['sb', 'predict', sys.argv[1], sys.argv[2], '--json'];\n"
            "try:\n    runpy.run_module('sbcli', run_name='__main__')\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.') or m == 'sbcli.api')\n"
            "print('IMPORTED', bad, file=sys.stderr)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    res = subprocess.run([sys.executable, "-c", code, str(served["onnx"]), str(served["images"])], check=False, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["provider"] == "cpu" and len(json.loads(res.stdout)["predictions"]) == 8
    assert "IMPORTED []" in res.stderr


def test_provider_options_are_checked(served) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["predict", str(served["onnx"]), str(served["images"]), "--provider", "gpu"])
    assert res.exit_code == 1 and "--provider gpu is unknown" in res.output
    res = runner.invoke(app, ["predict", str(served["learner"]), str(served["images"]), "--provider", "cpu"])
    assert res.exit_code == 1 and "applies to .onnx files" in res.output


def test_bad_inputs_are_one_clear_error(served, tmp_path: Path) -> None:
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(DataError, match="does not exist"):
        api.predict(served["onnx"], [tmp_path / "missing.png"])
    with pytest.raises(DataError, match="Cannot decode image .*broken.jpg"):
        api.predict(served["onnx"], [bad])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="No image files"):
        api.predict(served["onnx"], [tmp_path / "empty"])
    with pytest.raises(ConfigError, match="neither a learner directory"):
        api.predict(served["images"], [served["images"]])
    with pytest.raises(ConfigError, match="--top-k"):
        api.predict(served["onnx"], [served["images"]], top_k=0)
    res = CliRunner().invoke(app, ["predict", str(served["onnx"]), str(tmp_path / "missing.png")])
    assert res.exit_code == 1 and "does not exist" in res.output


def test_a_folder_with_bad_files_predicts_every_readable_image_and_fails(served, tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    shutil.copytree(served["images"], folder)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (folder / "nested" / "empty.png").write_bytes(b"")
    runner = CliRunner()
    res = runner.invoke(app, ["predict", str(served["onnx"]), str(folder)])
    assert res.exit_code == 1
    assert "top 3 of 8 images" in res.stdout and "img00.png" in res.stdout  # every readable image
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 2 and "broken.jpg" in errors[0] and "empty.png" in errors[1]  # one line per bad file
    assert "2 of 10 images could not be read; the other 8 were predicted." in res.stderr
    res = runner.invoke(app, ["predict", str(served["onnx"]), str(folder), "--json"])
    assert res.exit_code == 1
    report = json.loads(res.stdout)
    assert len(report["predictions"]) == 8 and [Path(f["image"]).name for f in report["failed"]] == ["broken.jpg", "empty.png"]


def test_onnx_file_without_sbcli_metadata_is_refused(served, tmp_path: Path) -> None:
    node = onnx.helper.make_node("Identity", ["images"], ["logits"])
    value = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph([node], "plain", [value("images", onnx.TensorProto.FLOAT, ["n", 3, SIZE, SIZE])],
                                   [value("logits", onnx.TensorProto.FLOAT, ["n", 3, SIZE, SIZE])])
    onnx.save_model(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(tmp_path / "plain.onnx"))
    with pytest.raises(ExportError, match="no sbcli metadata"):
        api.predict(tmp_path / "plain.onnx", [served["images"]])
    (tmp_path / "junk.onnx").write_bytes(b"junk")
    with pytest.raises(DataError, match="onnxruntime cannot load"):
        api.predict(tmp_path / "junk.onnx", [served["images"]])


HOSTILE = ["[/]", "[/bold]", "[bold red]x", "\x1b[31mred\x1b[0m", "\x1b]0;title\x07"]  # markup, CSI, OSC


def test_names_are_shown_as_written_never_as_markup_or_terminal_codes(served, tmp_path: Path) -> None:
    """Class names and file names that look like rich markup or hold escape sequences are printed as text."""
    model = onnx.load(str(served["onnx"]))
    for prop in model.metadata_props:
        if prop.key == "class_names":
            prop.value = json.dumps(HOSTILE)
    onnx.save_model(model, str(tmp_path / "hostile.onnx"))
    folder = tmp_path / "[bold red]x"
    for i, (name, image) in enumerate(zip(["[/].png", "[/bold].png", "[bold red]x.png", "\x1b[2Jclear.png"],
                                          write_images(tmp_path / "plain", 4, seed=3), strict=True)):
        (folder / str(i) / name).parent.mkdir(parents=True)  # "[/].png": a file "].png" in a folder "["
        shutil.copy(image, folder / str(i) / name)
    (folder / "3" / "\x1b[31mbroken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    res = CliRunner().invoke(app, ["predict", str(tmp_path / "hostile.onnx"), str(folder), "-k", "5"],
                             env={"COLUMNS": "400"})
    assert res.exit_code == 1, res.output  # the broken file; every other image predicted
    assert "\x1b" not in res.stdout and "\x1b" not in res.stderr and "\x07" not in res.stdout
    assert "bug in sbcli" not in res.output
    for shown in ("[/]", "[/bold]", "[bold red]x", "\\x1b[31mred\\x1b[0m", "\\x1b]0;title\\x07",
                  "[bold red]x/2/[bold red]x.png", "\\x1b[2Jclear.png", "top 5 of 4 images"):
        assert shown in res.stdout, shown
    assert "\\x1b[31mbroken.jpg" in res.stderr and "1 of 5 images could not be read" in res.stderr


def test_an_error_naming_a_path_shows_it_as_written(served, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["predict", str(served["onnx"]), str(tmp_path / "[/]\x1b[2J missing.png")])
    assert res.exit_code == 1 and "\x1b" not in res.output and "bug in sbcli" not in res.output
    assert "[/]\\x1b[2J missing.png does not exist" in res.stderr


def test_a_folder_nested_1500_deep_is_walked_without_recursion(served) -> None:
    """The walk keeps its own stack (a recursive rglob hit Python's recursion limit at about 1,000 levels)."""
    # Outside pytest's tmp_path, removed level by level: shutil.rmtree (pytest's clean-up of tmp_path) recurses too.
    top = tempfile.mkdtemp(prefix="sbcli-deep-")
    deep = top
    for _ in range(1500):  # one mkdir a level: os.makedirs itself recurses
        deep += "/d"
        os.mkdir(deep)
    shutil.copy(served["images"] / "img00.png", Path(deep) / "bottom.png")
    try:
        res = CliRunner().invoke(app, ["predict", str(served["onnx"]), top, "--json"])
    finally:
        os.remove(Path(deep) / "bottom.png")
        while deep != os.path.dirname(top):
            os.rmdir(deep)
            deep = os.path.dirname(deep)
    assert res.exit_code == 0, res.output
    (entry,) = json.loads(res.stdout)["predictions"]
    assert entry["image"].endswith("/d/bottom.png") and entry["image"].split("/").count("d") == 1500
