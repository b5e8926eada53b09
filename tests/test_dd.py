"""DD: the double-distillation loss, the temporary network's data, and that it is not kept."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sbcli import api
from sbcli.data.device import DeviceData
from sbcli.engine.loop import StepOutputs, TrainConfig
from sbcli.errors import ConfigError
from sbcli.methods import build_config, dd
from sbcli.methods.losses import ce_loss, kd_loss
from sbcli.methods.teachers import PairTeacher
from sbcli.nets import create_model


def test_loss_weights_both_distillations_and_ce():
    torch.manual_seed(0)
    logits, teacher = torch.randn(8, 5), torch.randn(8, 5)
    targets = torch.randint(0, 5, (8,))
    lam = 3 / 5
    got = dd.double_distillation_loss(3, lam)(StepOutputs(None, None, targets, logits, teacher))
    expected = (lam * kd_loss(logits[:, :3], teacher[:, :3]) + (1 - lam) * kd_loss(logits[:, 3:], teacher[:, 3:])
                + (1 - lam) * ce_loss(logits, targets))
    torch.testing.assert_close(got, expected)


def test_pair_teacher_puts_old_logits_then_new_logits():
    old, new = torch.nn.Linear(4, 3), torch.nn.Linear(4, 2)
    x = torch.randn(6, 4)
    torch.testing.assert_close(PairTeacher(old, new)(x), torch.cat([old(x), new(x)], 1))


def test_temporary_network_sees_the_new_task_alone():
    labels = torch.tensor([0, 1, 2, 3, 4, 2, 3])
    images = torch.arange(7, dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 3, 2, 2)
    data = dd.new_task_data(DeviceData(images, labels), num_old=2)
    assert data.labels.tolist() == [0, 1, 2, 0, 1]
    assert data.images[:, 0, 0, 0].tolist() == [2, 3, 4, 5, 6]


def test_config_refuses_other_inference_rules():
    with pytest.raises(ConfigError, match="not available for --method dd"):
        build_config("dd", {"inference": "bic"})


@pytest.fixture(scope="module")
def dd_learner(four_colors, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dd")
    train, test = four_colors["train"], four_colors["test"]
    run = api.RunOptions(method="dd", width=0.125, train=TrainConfig(epochs=1, batch_size=16), memory=8, device="cpu")
    seq = api.SequenceOptions(source=str(train), test=str(test), image_size=16, tasks=2)
    out = root / "dd"
    api.train(seq, run, out)
    return out


def test_temporary_network_is_not_in_the_saved_learner(dd_learner):
    tensors = load_file(str(dd_learner / json.loads((dd_learner / "learner.json").read_text())["files"]["model"]))
    plain = create_model("resnet18", 4, 0.125).state_dict()
    assert set(tensors) == set(plain)
    for key, value in plain.items():
        assert tensors[key].shape == value.shape, key


def test_dd_step_trained_the_temporary_network_then_distilled(dd_learner):
    from sbcli.learner.state import read_state

    history = read_state(dd_learner).history
    assert [p["name"] for p in history[1].phases] == ["dd-new", "dd"]
    assert history[1].phases[0]["epochs"] == 1
    assert "wa_factor" in history[1].record
