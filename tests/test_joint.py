"""The joint oracle: a step is single-task training on every class seen; add-task is refused."""

from pathlib import Path

import pytest
import torch
from conftest import write_class_folder

from sbcli import api
from sbcli.data.device import DeviceData, Normalization
from sbcli.engine.loop import Engine, TrainConfig
from sbcli.errors import ConfigError
from sbcli.methods import joint
from sbcli.methods.base import TaskContext
from sbcli.methods.first_task import learn_first_task
from sbcli.nets import create_model


def colour_images(num_classes: int, per_class: int, seed: int = 0) -> DeviceData:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    base = (labels[:, None] * 60 + torch.tensor([30, 90, 150])) % 256
    noise = torch.randint(-20, 21, (len(labels), 3, 8, 8), generator=gen)
    return DeviceData((base[:, :, None, None] + noise).clamp(0, 255).to(torch.uint8), labels)


def fresh(num_classes: int):
    torch.manual_seed(7)
    return create_model("resnet18", num_classes, 0.125)


def engine() -> Engine:
    return Engine(TrainConfig(epochs=1, batch_size=8), torch.device("cpu"), Normalization(), seed=3)


def context(step: int, model, data: DeviceData, seen: DeviceData | None, num_old: int) -> TaskContext:
    return TaskContext(step=step, model=model, teacher=None, data=data, num_old=num_old, num_total=model.num_classes,
                       engine=engine(), epochs=1, evaluate=lambda: None, make_aux_model=fresh,
                       seen_data=None if seen is None else (lambda: seen))


def test_a_joint_step_is_single_task_training_on_every_class_seen():
    seen = colour_images(4, 6)
    new_only = DeviceData(seen.images[seen.labels >= 2], seen.labels[seen.labels >= 2])
    learnt = create_model("resnet18", 4, 0.125)  # stands for the model after step 1: its weights must not matter
    torch.nn.init.normal_(learnt.head.weight)
    joint.learn_task(context(1, learnt, new_only, seen, num_old=2), joint.Config())

    single = fresh(4)
    learn_first_task(context(0, single, seen, None, num_old=0), head_rules=True)

    for key, value in single.state_dict().items():
        assert torch.equal(learnt.state_dict()[key], value), key


def test_joint_trains_on_every_seen_image_not_the_new_task_alone():
    seen = colour_images(4, 6)
    new_only = DeviceData(seen.images[seen.labels >= 2], seen.labels[seen.labels >= 2])
    with_seen, without = fresh(4), fresh(4)
    joint.learn_task(context(1, with_seen, new_only, seen, num_old=2), joint.Config())
    learn_first_task(context(0, without, new_only, None, num_old=2), head_rules=True)
    assert not torch.equal(with_seen.head.weight, without.head.weight)


def test_joint_refuses_a_step_without_the_earlier_images():
    data = colour_images(4, 2)
    with pytest.raises(ConfigError, match="sb train --method joint"):
        joint.learn_task(context(1, fresh(4), data, None, num_old=2), joint.Config())


@pytest.fixture(scope="module")
def colors(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("joint-colors")
    classes = ["red", "green", "blue", "yellow"]
    return {"train": write_class_folder(root / "train", classes, 24, seed=1),
            "test": write_class_folder(root / "test", classes, 8, seed=2),
            "new_train": write_class_folder(root / "new_train", ["purple"], 8, seed=3)}


def test_joint_sequence_sees_all_images_and_refuses_add_task(colors, tmp_path):
    out = tmp_path / "joint"
    run = api.RunOptions(method="joint", width=0.125, train=TrainConfig(epochs=1, batch_size=16), memory=0, device="cpu")
    seq = api.SequenceOptions(source=str(colors["train"]), test=str(colors["test"]), image_size=16, tasks=2)
    learner = api.train(seq, run, out)
    assert [h.record["joint_images"] for h in learner.state.history] == [48, 96]
    before = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match="add-task"):
        api.add_task(out, colors["new_train"], device="cpu")
    assert {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_unused_state_of_previous_model_does_not_leak():
    """Re-initialisation replaces every tensor, buffers (BN statistics) included."""
    model = create_model("resnet18", 4, 0.125)
    for buf in model.buffers():
        if buf.dtype.is_floating_point:
            buf.add_(5.0)
    ctx = context(1, model, colour_images(4, 2), colour_images(4, 2), num_old=2)
    joint.reinitialise(ctx)
    reference = fresh(4)
    for key, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
