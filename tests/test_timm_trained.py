"""A method that trains the network whole (``--method std``, ``finetune``) takes a timm architecture: its backbone
is trained with its head, grows, and exports with parity. S&B and DD keep sbcli's own ResNets (their partition)."""

from __future__ import annotations

import huggingface_hub as hf
import pytest
import torch
from safetensors.torch import save
from test_pretrained import publish

from sbcli import api
from sbcli.engine.loop import TrainConfig
from sbcli.learner.state import Learner

pytestmark = pytest.mark.usefixtures("one_thread")
TIMM_ARCH = "timm/test_resnet.r160_in1k"  # timm's smallest test ResNet; its Hub repo is the arch's name


@pytest.mark.parametrize("method", ["std", "finetune"])
def test_a_timm_backbone_is_trained_whole_grows_and_exports(color_data, fake_hub, tmp_path, method):
    timm = pytest.importorskip("timm")
    torch.manual_seed(3)
    published = timm.create_model(TIMM_ARCH.removeprefix("timm/"), pretrained=False)
    publish(hf.HfApi(), TIMM_ARCH, {"model.safetensors": save({k: v.contiguous() for k, v in published.state_dict().items()})})
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), tasks=1)
    run = api.RunOptions(method=method, arch=TIMM_ARCH, width=1.0, device="cpu", memory=8,
                         train=TrainConfig(epochs=1, batch_size=8, lr=0.01))
    api.train(seq, run, tmp_path / "learner")
    first = Learner.load(tmp_path / "learner", "cpu")
    weight = next(k for k, v in published.state_dict().items() if v.dim() == 4)  # its first convolution
    assert not torch.equal(first.model.body.state_dict()[weight], published.state_dict()[weight])  # trained, not frozen
    api.add_task(tmp_path / "learner", color_data["task2_train"], color_data["task2_test"], device="cpu")
    grown = Learner.load(tmp_path / "learner", "cpu")
    assert grown.state.num_classes == 4 and grown.state.steps == 2 and len(grown.memory) > 0
    report = api.export_onnx(tmp_path / "learner", tmp_path / "learner.onnx")
    assert report.parity.argmax_agreement == 1.0 and report.parity.max_abs_diff < 1e-4
