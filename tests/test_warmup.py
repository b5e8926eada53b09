"""Stable early training: the learning-rate warm-up (sbcli.engine.schedule, in the engine) and zero-initialised
residual BNs (``zero_init_residual``); both recorded in the learner, off in the paper recipes."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from sbcli import api
from sbcli.config import options
from sbcli.data.device import DeviceData, Normalization
from sbcli.engine.loop import Engine, Phase, TrainConfig
from sbcli.engine.schedule import make_schedule, steps_per_epoch
from sbcli.errors import ConfigError
from sbcli.methods.losses import ce_loss
from sbcli.nets import create_model
from sbcli.nets.resnet import BasicBlock

pytestmark = pytest.mark.usefixtures("one_thread")


def lrs_of_a_phase(cfg: TrainConfig, epochs: int, images: int, sgd_lrs: list[float]) -> list[float]:
    """The learning rate of every optimiser step of one engine phase."""
    before = len(sgd_lrs)
    torch.manual_seed(0)
    model = create_model("resnet32", 3, 0.25)
    labels = torch.arange(3).repeat_interleave(images // 3)
    data = DeviceData(torch.randint(0, 256, (len(labels), 3, 8, 8), dtype=torch.uint8), labels)
    engine = Engine(cfg, torch.device("cpu"), Normalization(), seed=0)
    engine.run(model, data, Phase("base", lambda out: ce_loss(out.logits, out.targets), epochs))
    return sgd_lrs[before:]


def test_the_first_steps_follow_the_linear_warm_up_then_the_step_decay(sgd_lrs):
    cfg = TrainConfig(epochs=4, batch_size=4, lr=0.1, warmup_epochs=1.0, milestones=(0.5,), lr_decay=0.1)
    lrs = lrs_of_a_phase(cfg, epochs=4, images=12, sgd_lrs=sgd_lrs)  # 3 steps an epoch
    expected = [0.1 / 3, 0.2 / 3, 0.1, 0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01]
    assert lrs == pytest.approx(expected, rel=1e-9)


def test_a_fractional_warm_up_and_a_warm_up_longer_than_the_first_milestone():
    sched = make_schedule(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), 1.0, (0.5,), 0.1,
                          epochs=2, batches_per_epoch=4, warmup_epochs=0.5)
    assert sched.warmup_steps == 2
    assert [sched.lr(0, k) for k in range(4)] == pytest.approx([0.5, 1.0, 1.0, 1.0])
    long = make_schedule(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), 1.0, (0.5,), 0.1,
                         epochs=2, batches_per_epoch=4, warmup_epochs=2)
    assert [long.lr(1, k) for k in (4, 7)] == pytest.approx([0.1 * 5 / 8, 0.1])  # both factors apply


def test_without_warm_up_the_schedule_is_the_papers_multistep(sgd_lrs):
    cfg = TrainConfig(epochs=10, batch_size=4, lr=0.1)  # milestones 3, 6, 8 of 10 epochs
    reference = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    multistep = torch.optim.lr_scheduler.MultiStepLR(reference, milestones=[3, 6, 8], gamma=0.1)
    expected = []
    for _ in range(10):
        expected.append(reference.param_groups[0]["lr"])
        reference.step()
        multistep.step()
    lrs = lrs_of_a_phase(cfg, epochs=10, images=6, sgd_lrs=sgd_lrs)  # 1 step an epoch
    assert lrs == pytest.approx(expected, rel=1e-12)


def test_steps_per_epoch_counts_the_batches_the_data_draws():
    gen = torch.Generator().manual_seed(0)
    for n, batch in ((12, 4), (13, 4), (3, 4), (0, 4)):
        data = DeviceData(torch.zeros(n, 3, 2, 2, dtype=torch.uint8), torch.zeros(n, dtype=torch.long))
        assert steps_per_epoch(n, batch) == len(list(data.batch_indices(batch, gen)))


def test_a_negative_warm_up_is_refused():
    with pytest.raises(ConfigError, match="warmup-epochs"):
        TrainConfig(warmup_epochs=-1)


@pytest.mark.parametrize("arch", ["resnet18", "resnet32", "resnet18-in"])
def test_zero_init_makes_every_residual_block_its_shortcut(arch):
    torch.manual_seed(0)
    model = create_model(arch, 4, 0.25, zero_init_residual=True).eval()
    blocks = [m for m in model.modules() if isinstance(m, BasicBlock)]
    assert blocks and all(torch.all(b.bn2.weight == 0) for b in blocks)
    for block in blocks:
        x = torch.relu(torch.randn(2, block.conv1.in_channels, 8, 8))  # a block's input is a ReLU's output
        skip = x if block.shortcut is None else block.shortcut(x)
        if block.shortcut_bn is not None:
            skip = block.shortcut_bn(skip)
        expected = x if block.shortcut is None else torch.relu(skip + block.bn2.bias.view(1, -1, 1, 1))
        torch.testing.assert_close(block(x), expected, rtol=0, atol=0)
    plain = create_model(arch, 4, 0.25).eval()
    assert not all(torch.all(m.bn2.weight == 0) for m in plain.modules() if isinstance(m, BasicBlock))


def test_own_data_runs_default_to_warm_up_and_the_paper_recipes_do_not(tmp_path):
    given = {name: None for name in ("recipe", "source", "out")} | {"out": str(tmp_path / "x")}
    _, run, _ = options.build_options(given, options.defaults_for(None))
    assert run.train.warmup_epochs == 1.0 and not run.train.zero_init_residual  # measured: zero-init stalled the demo
    _, asked_zero, _ = options.build_options(given | {"zero_init_residual": True}, options.defaults_for(None))
    assert asked_zero.train.zero_init_residual
    for recipe in ("paper-10", "paper-2"):
        _, paper, _ = options.build_options(given | {"recipe": recipe, "source": "cifar100"}, options.defaults_for("cifar100"))
        assert paper.train.warmup_epochs == 0.0 and not paper.train.zero_init_residual
    _, asked, _ = options.build_options(given | {"recipe": "paper-10", "source": "cifar100", "warmup_epochs": 2.0},
                                     options.defaults_for("cifar100"))
    assert asked.train.warmup_epochs == 2.0


def test_the_learner_records_them_and_an_old_learner_json_keeps_the_old_schedule(tiny_folders, tmp_path):
    train_dir, test_dir = tiny_folders
    cfg = TrainConfig(epochs=1, batch_size=16, warmup_epochs=0.5, zero_init_residual=True)
    run = api.RunOptions(method="finetune", width=0.125, train=cfg, memory=8, device="cpu")
    api.train(api.SequenceOptions(source=str(train_dir), test=str(test_dir), tasks=1), run, tmp_path / "l")
    recorded = json.loads((tmp_path / "l" / "learner.json").read_text())["train_config"]
    assert recorded["warmup_epochs"] == 0.5 and recorded["zero_init_residual"] is True
    old = {k: v for k, v in asdict(TrainConfig()).items() if k not in ("warmup_epochs", "zero_init_residual")}
    rebuilt = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in old.items()})
    assert rebuilt.warmup_epochs == 0.0 and not rebuilt.zero_init_residual


@pytest.fixture
def tiny_folders(tmp_path: Path) -> tuple[Path, Path]:
    from conftest import write_class_folder

    return (write_class_folder(tmp_path / "train", ["red", "green"], 12, seed=1),
            write_class_folder(tmp_path / "test", ["red", "green"], 4, seed=2))
