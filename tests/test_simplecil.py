"""--method simplecil: prototypes on a frozen backbone (a torchvision-layout ResNet-18 of random weights,
and a timm model of random weights from the local Hub), old prototypes never change, export parity,
a pulled learner without memory grows, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fake_hub import FakeHub
from safetensors.torch import save, save_file
from test_pretrained import publish, timm_checkpoint
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.engine.loop import Engine, TrainConfig
from sbcli.errors import ConfigError
from sbcli.learner.state import Learner
from sbcli.methods.simplecil import PROTOTYPES_KEY, SCALE_KEY, class_prototypes

pytestmark = pytest.mark.usefixtures("one_thread")
WIDTH = 0.125
TIMM_ARCH = "timm/test_resnet.r160_in1k"  # timm's smallest test ResNet; its Hub repo is the arch's name


@pytest.fixture(scope="module")
def backbone_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A torchvision/timm-layout ResNet-18 checkpoint (1000-class fc) of random weights, as safetensors."""
    path = tmp_path_factory.mktemp("weights") / "resnet18.safetensors"
    save_file(timm_checkpoint("resnet18-in"), str(path))
    return path


def run_options(pretrained: str | None, arch: str = "resnet18-in", width: float = WIDTH, **kw) -> api.RunOptions:
    options = {"method": "simplecil", "arch": arch, "width": width, "pretrained": pretrained, "device": "cpu",
               "train": TrainConfig(epochs=1, batch_size=16, lr=0.05), "memory": 0}
    return api.RunOptions(**{**options, **kw})


@pytest.fixture(scope="module")
def simplecil_learner(color_data, backbone_file, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One task (red, green) with --method simplecil on the random ResNet-18: read it, never write it."""
    out = tmp_path_factory.mktemp("simplecil") / "learner"
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), image_size=32,
                              tasks=1)
    api.train(seq, run_options(str(backbone_file)), out)
    return out


def test_prototypes_are_the_mean_normalised_features_and_scores_the_cosine():
    feats = torch.tensor([[3.0, 4.0], [0.0, 2.0], [1.0, 0.0]])
    protos = class_prototypes(feats, torch.tensor([5, 5, 6]), range(5, 7))
    torch.testing.assert_close(protos, torch.tensor([[0.3, 0.9], [1.0, 0.0]]))
    with pytest.raises(ConfigError, match="no training image"):
        class_prototypes(feats, torch.tensor([5, 5, 5]), range(5, 7))


def test_the_learner_holds_the_prototypes_of_its_frozen_backbone(simplecil_learner, color_data):
    learner = Learner.load(simplecil_learner, "cpu")
    state = learner.state
    assert state.method == "simplecil" and state.memory.budget == 0 and len(learner.memory) == 0
    assert state.history[0].phases == []  # no training at all
    protos = learner.extra[PROTOTYPES_KEY]
    assert protos.dtype == torch.float32 and protos.shape == (2, learner.model.num_features)
    # the backbone is exactly the loaded weights
    conv = timm_checkpoint("resnet18-in")["layer4.1.conv2.weight"]
    torch.testing.assert_close(learner.model.stages[3][1].conv2.weight.detach(), conv, rtol=0, atol=0)
    # and the prototypes are the class means of its normalised features, recomputed here
    from sbcli.data.catalog import open_spec, resolve_spec

    images = open_spec(resolve_spec(str(color_data["task1_train"]), test=None, image_size=32,
                                    data_root=None, download=False), train=True, test=False).train
    engine = Engine(TrainConfig(), torch.device("cpu"), learner.norm, 0)
    feats = engine.features(learner.model, images.images)
    order = [images.class_names.index(n) for n in state.class_names]
    labels = torch.tensor([order.index(int(y)) for y in images.labels])
    torch.testing.assert_close(protos, class_prototypes(feats, labels, range(2)), rtol=1e-5, atol=1e-6)


def test_add_task_computes_the_new_prototypes_only(simplecil_learner, color_data, tmp_path):
    import shutil

    grown = tmp_path / "grown"
    shutil.copytree(simplecil_learner, grown)
    before = Learner.load(grown, "cpu")
    summary = api.add_task(grown, color_data["task2_train"], color_data["task2_test"], device="cpu")
    after = Learner.load(grown, "cpu")
    old, new = before.extra[PROTOTYPES_KEY], after.extra[PROTOTYPES_KEY]
    assert new.shape[0] == 4 and torch.equal(new[:2], old)  # bit-identical
    assert not torch.equal(new[2], new[3])
    for name, tensor in before.model.state_dict().items():  # the backbone did not move
        if not name.startswith("head."):
            assert torch.equal(after.model.state_dict()[name], tensor), name
    assert after.state.history[-1].phases == [] and summary.num_classes == 4
    assert after.state.history[-1].record["prototypes_from"] == 48  # the 24 training images of each new class
    # colours are easy: prototypes of a random backbone still separate them well above chance (25 %)
    assert summary.metrics.overall > 60.0


def test_export_parity_folds_the_prototypes_into_one_linear_layer(simplecil_learner, tmp_path):
    import onnx

    report = api.export_onnx(simplecil_learner, tmp_path / "model.onnx")
    assert report.parity.argmax_agreement == 1.0 and report.parity.max_abs_diff < 1e-4
    graph = onnx.load(str(tmp_path / "model.onnx")).graph
    assert sum(node.op_type in ("MatMul", "Gemm") for node in graph.node) == 1  # the prototype head, no other
    # sb serve reads either form unchanged, and both score alike
    from sbcli.export.serving import open_learner
    from sbcli.serve.classifier import open_classifier

    images = torch.rand(3, 3, 32, 32).numpy()
    onnx_scores = open_classifier(tmp_path / "model.onnx").scores(images)
    torch_scores = open_classifier(simplecil_learner, device="cpu", open_learner=open_learner).scores(images)
    scale = float(Learner.load(simplecil_learner, "cpu").extra[SCALE_KEY])
    assert abs(onnx_scores - torch_scores).max() < 1e-4 * scale
    assert (abs(onnx_scores) <= scale * (1 + 1e-5)).all()  # cosines times the stored scale


def test_a_pulled_learner_without_memory_grows(simplecil_learner, color_data, fake_hub: FakeHub, tmp_path):
    api.push(simplecil_learner, "me/colours-simplecil")
    pulled = api.pull("me/colours-simplecil", tmp_path / "pulled").path
    summary = api.add_task(pulled, color_data["task2_train"], color_data["task2_test"], device="cpu")
    assert summary.num_classes == 4
    assert torch.equal(Learner.load(pulled, "cpu").extra[PROTOTYPES_KEY][:2],
                       Learner.load(simplecil_learner, "cpu").extra[PROTOTYPES_KEY])


def test_adapt_epochs_train_the_first_task_then_freeze(color_data, backbone_file, tmp_path):
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), image_size=32,
                              tasks=1)
    run = run_options(str(backbone_file), method_options={"adapt_epochs": 1})
    learner = api.train(seq, run, tmp_path / "adapted")
    assert [p["name"] for p in learner.state.history[0].phases] == ["adapt"]
    conv = timm_checkpoint("resnet18-in")["layer4.1.conv2.weight"]
    assert not torch.equal(learner.model.stages[3][1].conv2.weight.detach(), conv)
    before = {k: v.clone() for k, v in learner.model.state_dict().items() if not k.startswith("head.")}
    api.add_task(tmp_path / "adapted", color_data["task2_train"], color_data["task2_test"], device="cpu")
    after = Learner.load(tmp_path / "adapted", "cpu")
    assert after.state.history[-1].phases == []
    assert all(torch.equal(after.model.state_dict()[k], v) for k, v in before.items())


@pytest.mark.parametrize("arch", [TIMM_ARCH, "timm/test_vit.r160_in1k"])  # a ResNet and a ViT (classifier "head")
def test_a_timm_model_from_the_hub_is_resized_normalised_and_recorded(color_data, fake_hub: FakeHub, tmp_path, arch):
    timm = pytest.importorskip("timm")
    import huggingface_hub as hf

    torch.manual_seed(3)
    reference = timm.create_model(arch.removeprefix("timm/"), pretrained=False)  # 1000-class fc, as published
    publish(hf.HfApi(), arch, {"model.safetensors": save({k: v.contiguous() for k, v in reference.state_dict().items()})})
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), tasks=1)
    learner = api.train(seq, run_options(None, arch=arch, width=1.0), tmp_path / "timm")
    state = json.loads((tmp_path / "timm" / "learner.json").read_text())
    assert state["arch"] == arch and state["image_size"] == 160  # timm's resolution for it
    assert state["normalization"] == {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}
    record = state["provenance"]["pretrained"]
    assert record["repo"] == arch and len(record["sha256"]) == 64 and len(record["commit"]) == 40
    # the backbone computes what timm's model computes
    x = torch.randn(2, 3, 160, 160)
    reference.eval(), learner.model.eval()
    torch.testing.assert_close(learner.model.forward_features(x), reference.forward_head(reference.forward_features(x),
                                                                                          pre_logits=True))
    api.add_task(tmp_path / "timm", color_data["task2_train"], color_data["task2_test"], device="cpu")
    grown = Learner.load(tmp_path / "timm", "cpu")
    assert torch.equal(grown.extra[PROTOTYPES_KEY][:2], learner.extra[PROTOTYPES_KEY])
    report = api.export_onnx(tmp_path / "timm", tmp_path / "timm.onnx")
    assert report.parity.argmax_agreement == 1.0 and report.parity.max_abs_diff < 1e-4
    assert all(h.phases == [] for h in grown.state.history)


@pytest.mark.parametrize("args, says", [
    (["--method", "sb", "--arch", "timm/resnet18.a1_in1k"], "trains the partition of sbcli's own ResNets"),
    (["--method", "simplecil", "--balance-epochs", "2"], "does not go with --method simplecil"),
    (["--method", "simplecil", "--inference", "wa"], "cosine similarity"),
    (["--method", "simplecil", "--adapt-epochs", "-1"], "--adapt-epochs -1"),
])
def test_refusals_are_one_sentence_before_any_work(color_data, tmp_path, args, says):
    out = tmp_path / "never"
    result = CliRunner().invoke(app, ["train", str(color_data["task1_train"]), "--pretrained", "none", "--out", str(out), *args])
    assert result.exit_code != 0 and says in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output and not out.exists()


def test_add_task_refuses_balancing_with_the_learner_unchanged(simplecil_learner, color_data):
    before = {p: p.read_bytes() for p in sorted(simplecil_learner.rglob("*")) if p.is_file()}
    result = CliRunner().invoke(app, ["add-task", str(simplecil_learner), str(color_data["task2_train"]),
                                      "--balance-epochs", "2"])
    assert result.exit_code != 0 and "does not go with --method simplecil" in " ".join(result.output.split())
    assert {p: p.read_bytes() for p in sorted(simplecil_learner.rglob("*")) if p.is_file()} == before
