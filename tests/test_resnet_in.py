"""ImageNet-style ResNet-18/34 (``--arch resnet18-in`` / ``resnet34-in``): the torchvision layout, and
Split-and-Bridge's invariants on their last stage exactly as on the CIFAR ResNet (tests/test_partition.py)."""

from __future__ import annotations

import pytest
import torch

from sbcli.data.device import DeviceData, Normalization
from sbcli.engine.loop import Engine, Phase, TrainConfig
from sbcli.methods.teachers import frozen_copy
from sbcli.methods.split_bridge import separated_loss
from sbcli.nets import create_model, list_models
from sbcli.nets.partition import (
    bridge,
    cross_mask,
    cross_norm,
    disconnect,
    enforce_masks,
    make_partition,
    reset_split_batchnorms,
)
from sbcli.nets.resnet import IncrementalResNet

pytestmark = pytest.mark.usefixtures("one_thread")
ARCHS = ["resnet18-in", "resnet34-in"]
NUM_OLD, NUM_TOTAL = 3, 5


def tiny(arch: str, num_classes: int = NUM_TOTAL, seed: int = 0) -> IncrementalResNet:
    """A 1/8-width network with non-trivial BatchNorm statistics, in eval mode."""
    torch.manual_seed(seed)
    model = create_model(arch, num_classes, 0.125)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.2, 0.2)
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    with torch.no_grad():
        model.head.bias.uniform_(-0.1, 0.1)
    return model.eval()


@pytest.mark.parametrize(("arch", "blocks"), [("resnet18-in", [2, 2, 2, 2]), ("resnet34-in", [3, 4, 6, 3])])
def test_torchvision_layout(arch, blocks):
    assert arch in list_models()
    model = create_model(arch, 10, 1.0)
    assert model.conv1.kernel_size == (7, 7) and model.conv1.stride == (2, 2)
    assert isinstance(model.maxpool, torch.nn.MaxPool2d)
    assert [len(stage) for stage in model.stages] == blocks
    assert [stage[0].conv2.out_channels for stage in model.stages] == [64, 128, 256, 512]
    # a BN after every projection shortcut (torchvision's downsample.1), none on identities
    for stage in model.stages:
        for block in stage:
            assert (block.shortcut is None) == (block.shortcut_bn is None)
    parameters = sum(p.numel() for p in model.parameters())
    # torchvision resnet18 / resnet34 with a 10-class fc: 11,181,642 / 21,289,802 parameters
    assert parameters == {"resnet18-in": 11_181_642, "resnet34-in": 21_289_802}[arch]
    assert model.eval()(torch.randn(2, 3, 64, 64)).shape == (2, 10)


def described(model: IncrementalResNet) -> list[tuple]:
    return [(l.name, l.in_set, l.out_set, tuple(l.module.weight.shape)) for l in model.partitioned_layers()]


def test_resnet18_in_partitions_the_same_six_tensors_as_the_cifar_resnet18():
    model, reference = create_model("resnet18-in", 20, 1.0), create_model("resnet18", 20, 1.0)
    assert described(model) == described(reference)
    assert model.split_blocks_list() == list(model.stages[3])
    assert model.partitioned_layers()[2].module is model.stages[3][0].shortcut
    assert make_partition(model, 1.15, 10).old == make_partition(reference, 1.15, 10).old


def test_resnet34_in_partitions_the_three_blocks_of_stage_4():
    model = create_model("resnet34-in", 20, 1.0)
    assert model.split_blocks_list() == list(model.stages[3])
    sets = [(name, i, o) for name, i, o, _ in described(model)]
    assert sets == [("b0.conv1", "in", "b0.mid"), ("b0.conv2", "b0.mid", "b0.out"), ("b0.shortcut", "in", "b0.out"),
                    ("b1.conv1", "b0.out", "b1.mid"), ("b1.conv2", "b1.mid", "b0.out"),
                    ("b2.conv1", "b0.out", "b2.mid"), ("b2.conv2", "b2.mid", "b0.out"), ("head", "b0.out", "classes")]
    part = make_partition(model, 1.15, 10)
    assert part.width["in"] == 256 and part.old["in"] == 147 and part.old["b2.mid"] == 294


def branch_parameters(model: IncrementalResNet, part, branch: str) -> list[tuple[torch.Tensor, slice]]:
    """(tensor, rows) of one branch: partitioned weights' output rows, their BNs' channels, head rows and bias."""
    pick = (lambda n, old: slice(0, old)) if branch == "old" else (lambda n, old: slice(old, n))
    out = []
    owners = {}
    for layer in model.partitioned_layers():
        rows = pick(layer.module.weight.shape[0], part.old[layer.out_set])
        out.append((layer.module.weight, rows))
        owners[id(layer.module)] = layer
        if layer.name == "head":
            out.append((layer.module.bias, rows))
    for block in model.split_blocks_list():
        for bn, conv in ((block.bn1, block.conv1), (block.bn2, block.conv2), (block.shortcut_bn, block.shortcut)):
            if bn is None or id(conv) not in owners:
                continue
            rows = pick(bn.weight.shape[0], part.old[owners[id(conv)].out_set])
            out += [(bn.weight, rows), (bn.bias, rows), (bn.running_mean, rows)]
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("branch", "kept", "moved"), [("new", "old", "new"), ("old", "new", "old")])
def test_after_disconnect_one_branch_does_not_see_the_other(arch, branch, kept, moved):
    model = tiny(arch)
    part = make_partition(model, 1.0, NUM_OLD)
    assert part.is_split
    disconnect(model, part)
    x = torch.randn(3, 3, 32, 32)
    cols = {"old": slice(0, NUM_OLD), "new": slice(NUM_OLD, NUM_TOTAL)}
    before = model(x)
    with torch.no_grad():
        for tensor, rows in branch_parameters(model, part, branch):
            tensor[rows] += torch.randn_like(tensor[rows])
    after = model(x)
    torch.testing.assert_close(after[:, cols[kept]], before[:, cols[kept]], rtol=0, atol=1e-5)
    assert (after[:, cols[moved]] - before[:, cols[moved]]).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_masked_cross_weights_stay_exactly_zero_through_training(arch):
    torch.manual_seed(0)
    model = create_model(arch, NUM_OLD, 0.125)
    teacher = frozen_copy(model)
    model.expand_classes(NUM_TOTAL - NUM_OLD)
    part = make_partition(model, 1.0, NUM_OLD)
    disconnect(model, part)
    before = {l.name: l.module.weight.detach().clone() for l in model.partitioned_layers()}
    gen = torch.Generator().manual_seed(1)
    labels = torch.arange(NUM_TOTAL).repeat_interleave(4)
    data = DeviceData(torch.randint(0, 256, (len(labels), 3, 32, 32), generator=gen, dtype=torch.uint8), labels)
    engine = Engine(TrainConfig(epochs=1, batch_size=10, weight_decay=5e-2, warmup_epochs=1), torch.device("cpu"),
                    Normalization(), seed=0)
    engine.run(model, data, Phase("B", separated_loss(NUM_OLD), 2, teacher, after_step=(enforce_masks,)))
    for layer in model.partitioned_layers():
        weight, mask = layer.module.weight.detach(), cross_mask(layer, part)
        assert torch.count_nonzero(weight * mask) == 0, layer.name
        assert not torch.equal(weight * (1 - mask), before[layer.name] * (1 - mask)), layer.name


@pytest.mark.parametrize("arch", ARCHS)
def test_bridge_leaves_the_function_unchanged(arch):
    model = tiny(arch)
    part = make_partition(model, 1.0, NUM_OLD)
    assert cross_norm(model, part) > 0
    disconnect(model, part)
    assert cross_norm(model, part) == 0
    x = torch.randn(3, 3, 32, 32)
    split_out = model(x)
    bridge(model)
    assert all(l.module.mask is None for l in model.partitioned_layers())
    torch.testing.assert_close(model(x), split_out, rtol=0, atol=0)


def test_bn_reset_covers_the_shortcut_bn_of_stage_4():
    model = tiny("resnet18-in")
    block0 = model.split_blocks_list()[0]
    assert block0.shortcut_bn in model.split_batchnorms()
    reset_split_batchnorms(model)
    assert torch.all(block0.shortcut_bn.weight == 1) and torch.all(block0.shortcut_bn.running_mean == 0)


@pytest.mark.parametrize("arch", ["resnet18", "resnet32", "resnet18-in", "resnet34-in"])
def test_the_meta_network_has_every_name_shape_and_dtype_and_nothing_else(arch):
    from sbcli.nets.meta import meta_model

    real = create_model(arch, 7, 0.25).state_dict()
    meta = meta_model(arch, 7, 0.25).state_dict()
    assert {k: (v.shape, v.dtype) for k, v in meta.items()} == {k: (v.shape, v.dtype) for k, v in real.items()}
    assert all(v.is_meta for v in meta.values())
    first, second = torch.rand(3), torch.rand(3)  # outside it, draws are draws
    assert not torch.equal(first, second)


def test_checking_a_learners_tensors_does_not_import_the_compiler():
    """Drawing a normal on the meta device imports torch._dynamo (0.8 s a load on a 2-core CPU); the check draws none."""
    import subprocess
    import sys

    code = ("import sys; from sbcli.nets.meta import meta_model; from sbcli.learner.preflight import save_bytes; "
            "meta_model('resnet18-in', 3, 1.0); save_bytes('resnet34-in', 1.0, 3, 224, 10); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
