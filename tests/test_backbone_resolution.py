"""``--pretrained`` ImageNet weights set the images' resolution: without ``--image-size`` a new learner trains at
the size the weights were trained at (timm's configuration of a ``timm/NAME`` Hub repository, else 224 for weights
in timm's/torchvision's ResNet layout), recorded as ``provenance.pretrained.input_size``; a given ``--image-size``
is kept and said in one line of the log when it is another."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from conftest import write_class_folder
from fake_hub import FakeHub
from safetensors.torch import save, save_file
from test_pretrained import publish, timm_checkpoint
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.engine.loop import TrainConfig
from sbcli.hub import pretrained
from sbcli.nets import create_model

pytestmark = pytest.mark.usefixtures("one_thread")
WIDTH = 0.125
WARNING = r"--image-size 64 is not 224, the resolution the pretrained weights \(imagenet\.safetensors\)"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two classes of 16-px images, a few of each: at 224 px a frozen backbone's one pass stays quick on a CPU."""
    root = tmp_path_factory.mktemp("few")
    return {"train": write_class_folder(root / "train", ["red", "green"], 2, seed=1),
            "test": write_class_folder(root / "test", ["red", "green"], 1, seed=2)}


@pytest.fixture(scope="module")
def imagenet_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ResNet-18 weights as timm/torchvision save them (their ImageNet layout, 1000-class fc), random values."""
    path = tmp_path_factory.mktemp("weights") / "imagenet.safetensors"
    save_file(timm_checkpoint("resnet18-in"), str(path))
    return path


def run_options(ref: str, arch: str = "resnet18-in") -> api.RunOptions:
    return api.RunOptions(method="simplecil", arch=arch, width=WIDTH, pretrained=ref, device="cpu", memory=0,
                          train=TrainConfig(epochs=1, batch_size=8))


def learner_json(out: Path) -> dict:
    return json.loads((out / "learner.json").read_text())


def test_imagenet_weights_set_the_resolution_and_record_it(data, imagenet_file, tmp_path):
    out = tmp_path / "l"
    seq = api.SequenceOptions(source=str(data["train"]), test=str(data["test"]), tasks=1)
    learner = api.train(seq, run_options(str(imagenet_file)), out)
    state = learner_json(out)
    assert state["image_size"] == 224 and state["provenance"]["pretrained"]["input_size"] == 224
    assert learner.state.image_size == 224
    # resumed with the same options (no --image-size): the same resolution, so the same source
    api.train(seq, run_options(str(imagenet_file)), out, resume=True)
    assert learner_json(out)["image_size"] == 224


def test_a_given_image_size_wins_and_the_log_says_it_differs(data, imagenet_file, tmp_path, caplog):
    seq = api.SequenceOptions(source=str(data["train"]), test=str(data["test"]), tasks=1, image_size=64)
    with caplog.at_level(logging.WARNING, logger="sbcli"):
        api.train(seq, run_options(str(imagenet_file)), tmp_path / "l")
    state = learner_json(tmp_path / "l")
    assert state["image_size"] == 64 and state["provenance"]["pretrained"]["input_size"] == 224
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "--image-size" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0]
    assert re.search(WARNING, said[0]) and "resized to 64 as asked" in said[0]
    caplog.clear()
    seq = api.SequenceOptions(source=str(data["train"]), test=str(data["test"]), tasks=1, image_size=224)
    with caplog.at_level(logging.WARNING, logger="sbcli"):
        api.train(seq, run_options(str(imagenet_file)), tmp_path / "same")
    assert not [r for r in caplog.records if "--image-size" in r.getMessage()]  # the weights' own size: nothing said


def test_sb_train_on_a_folder_follows_the_weights_and_logs_another_size(data, imagenet_file, tmp_path, caplog):
    """`sb train FOLDER` (whose --image-size default is 32) at the weights' 224 unless told otherwise, even quiet."""
    args = ["train", str(data["train"]), "--test", str(data["test"]), "--arch", "resnet18-in", "--width", str(WIDTH),
            "--method", "simplecil", "--pretrained", str(imagenet_file), "--device", "cpu", "--quiet"]
    with caplog.at_level(logging.WARNING, logger="sbcli"):
        res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "a")])
        assert res.exit_code == 0, res.output
        assert learner_json(tmp_path / "a")["image_size"] == 224 and "--image-size" not in caplog.text
        res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "b"), "--image-size", "64"])
    assert res.exit_code == 0, res.output
    assert learner_json(tmp_path / "b")["image_size"] == 64
    assert [r.name for r in caplog.records if re.search(WARNING, r.getMessage())] == ["sbcli.run.sequence"]


def test_a_timm_hub_repository_gives_timms_resolution_for_its_tag(data, fake_hub: FakeHub, tmp_path):
    pytest.importorskip("timm")
    import huggingface_hub as hf

    repo = "timm/test_resnet.r160_in1k"  # timm trains it at 160: not the 224 of other ImageNet weights
    publish(hf.HfApi(), repo, {"model.safetensors": save(timm_checkpoint("resnet18-in"))})
    seq = api.SequenceOptions(source=str(data["train"]), test=str(data["test"]), tasks=1)
    api.train(seq, run_options(repo), tmp_path / "l")
    state = learner_json(tmp_path / "l")
    record = state["provenance"]["pretrained"]
    assert state["image_size"] == 160 and record["input_size"] == 160 and record["repo"] == repo


def test_an_sbcli_backbones_own_weights_keep_the_folder_default(data, tmp_path):
    """Weights under sbcli's names may come from any resolution: nothing is assumed (their learner says it)."""
    path = tmp_path / "ours.safetensors"
    save_file({k: v.contiguous() for k, v in create_model("resnet18", 10, WIDTH).state_dict().items()}, str(path))
    assert "input_size" not in pretrained.load(str(path), "resnet18", WIDTH).record
    seq = api.SequenceOptions(source=str(data["train"]), test=str(data["test"]), tasks=1)
    api.train(seq, run_options(str(path), arch="resnet18"), tmp_path / "l")
    state = learner_json(tmp_path / "l")
    assert state["image_size"] == 32 and "input_size" not in state["provenance"]["pretrained"]


def test_which_weights_have_a_known_resolution():
    size = pretrained.weights_input_size
    assert size({"source": "file"}, "resnet34-in", imagenet_names=True) == 224
    assert size({"source": "hub", "repo": "someone/resnet18"}, "resnet18-in", imagenet_names=True) == 224
    assert size({"source": "file"}, "resnet18-in", imagenet_names=False) is None  # sbcli's own names
    assert size({"source": "file"}, "resnet18", imagenet_names=True) is None  # a CIFAR-style stem


def test_timms_configuration_names_the_resolution_of_its_repositories_and_architectures():
    pytest.importorskip("timm")
    size = pretrained.weights_input_size
    assert size({"source": "hub", "repo": "timm/test_vit.r160_in1k"}, "resnet18-in", imagenet_names=True) == 160
    assert size({"source": "hub", "repo": "timm/not_a_model"}, "resnet18-in", imagenet_names=True) == 224
    assert size({"source": "file"}, "timm/test_resnet.r160_in1k", imagenet_names=True) == 160
    assert size({"source": "hub", "repo": "timm/hf-hub:a/b"}, "resnet18", imagenet_names=True) is None  # never read
