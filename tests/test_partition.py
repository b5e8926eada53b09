"""The stage-4 partition (docs/method.md §3 and §4): channel counts, cross blocks, disconnect, bridge, penalties."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from sbcli.nets import create_model
from sbcli.nets.layers import MaskedLinear
from sbcli.nets.partition import (
    SOFT_OWN,
    bridge,
    cross_mask,
    cross_norm,
    disconnect,
    enforce_masks,
    group_lasso,
    make_partition,
    reset_split_batchnorms,
    sparsity_code,
    sparsity_paper,
    split_fraction,
)
from sbcli.nets.resnet import IncrementalResNet

# docs/method.md §6: (classes per task, rho) for 2/5/10/20 tasks.
PAPER_TABLE = {
    "cifar100": (100, {2: (50, "1.0"), 5: (20, "1.35"), 10: (10, "1.15"), 20: (5, "1.0")}),
    "tiny-imagenet": (200, {2: (100, "1.0"), 5: (40, "1.35"), 10: (20, "1.2"), 20: (10, "1.113")}),
}
# Worked by hand from bf = rho * t / (t + 1) < 1: how many of the T - 1 incremental steps are split.
SPLIT_STEPS = {("cifar100", 2): 1, ("cifar100", 5): 2, ("cifar100", 10): 6, ("cifar100", 20): 19,
               ("tiny-imagenet", 2): 1, ("tiny-imagenet", 5): 2, ("tiny-imagenet", 10): 4, ("tiny-imagenet", 20): 8}


def paper_steps() -> list[tuple[str, int, int, str, int, int]]:
    """(dataset, tasks, step, rho, C_old, C_total) for every incremental step of the spec's table."""
    cases = []
    for dataset, (_, settings) in PAPER_TABLE.items():
        for tasks, (size, rho) in settings.items():
            cases += [(dataset, tasks, t + 1, rho, size * t, size * (t + 1)) for t in range(1, tasks)]
    return cases


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def full_resnet18() -> IncrementalResNet:
    """The full-width ResNet-18 of the paper (its head is swapped per case: only its size matters)."""
    return create_model("resnet18", 10, 1.0)


def with_classes(model: IncrementalResNet, num_total: int) -> IncrementalResNet:
    model.head = MaskedLinear(model.num_features, num_total)
    return model


def small_net(arch: str = "resnet18", num_classes: int = 6, seed: int = 0) -> IncrementalResNet:
    """A small network with non-trivial BatchNorm statistics, in eval mode."""
    torch.manual_seed(seed)
    model = create_model(arch, num_classes, 0.25 if arch == "resnet18" else 0.5)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.2, 0.2)
            module.running_mean.uniform_(-0.1, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    with torch.no_grad():
        model.head.bias.uniform_(-0.1, 0.1)
    return model.eval()


def split_input(model: IncrementalResNet, batch: int = 3) -> torch.Tensor:
    """A random input of the partitioned blocks (the output of the shared part)."""
    channels = model.partitioned_layers()[0].module.weight.shape[1]
    return torch.randn(batch, channels, 4, 4)


def top_logits(model: IncrementalResNet, z: torch.Tensor) -> torch.Tensor:
    """The partitioned blocks and the head applied to the shared part's output ``z``."""
    for block in model.split_blocks_list():
        z = block(z)
    return model.forward_head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(z, 1), 1))


# --------------------------------------------------------------------------------------------
# Channel counts
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("dataset", "tasks", "step", "rho", "num_old", "num_total"), paper_steps())
def test_channel_counts_of_every_step_of_the_paper_table(full_resnet18, dataset, tasks, step, rho, num_old, num_total):
    bf = min(Fraction(1), Fraction(rho) * num_old / num_total)
    part = make_partition(with_classes(full_resnet18, num_total), float(rho), num_old)
    assert part.width == {"in": 256, "b0.mid": 512, "b0.out": 512, "b1.mid": 512, "classes": num_total}
    assert part.old["in"] == math.floor(256 * bf)
    for channel_set in ("b0.mid", "b0.out", "b1.mid"):
        assert part.old[channel_set] == math.floor(512 * bf)
    assert part.old["classes"] == num_old
    assert part.is_split == (bf < 1)
    if bf == 1:  # not split: every channel set is wholly old
        assert part.old["in"] == 256 and part.old["b0.mid"] == 512 and part.width["b1.mid"] - part.old["b1.mid"] == 0


@pytest.mark.parametrize(("dataset", "tasks"), list(SPLIT_STEPS))
def test_which_steps_are_split(full_resnet18, dataset, tasks):
    size, rho = PAPER_TABLE[dataset][1][tasks]
    split = [make_partition(with_classes(full_resnet18, size * (t + 1)), float(rho), size * t).is_split
             for t in range(1, tasks)]
    assert sum(split) == SPLIT_STEPS[dataset, tasks]
    assert split == sorted(split, reverse=True)  # the early steps are split, the later ones not


def test_hand_worked_counts(full_resnet18):
    # CIFAR-100, 10 tasks, step 2: bf = 1.15 * 10 / 20 = 0.575 -> 294.4 and 147.2 channels.
    part = make_partition(with_classes(full_resnet18, 20), 1.15, 10)
    assert (part.old["b0.mid"], part.old["in"], part.width["b0.out"] - part.old["b0.out"]) == (294, 147, 218)
    # Tiny-ImageNet, 5 tasks, step 4: bf = 1.35 * 120 / 160 = 1.0125 -> 1: not split.
    part = make_partition(with_classes(full_resnet18, 160), 1.35, 120)
    assert not part.is_split and part.bf == 1.0
    # Tiny-ImageNet, 10 tasks, step 6: bf = 1.2 * 100 / 120 is exactly 1 (no 511-channel split from rounding).
    part = make_partition(with_classes(full_resnet18, 120), 1.2, 100)
    assert not part.is_split and part.old["b1.mid"] == 512


def test_split_fraction_is_exact_at_the_boundary():
    assert split_fraction(1.2, 100, 120) == 1
    assert split_fraction(1.15, 10, 20) == Fraction(23, 40)
    assert split_fraction(3.0, 1, 2) == 1


def test_resnet18_partitions_the_six_tensors_of_stage_4():
    model = create_model("resnet18", 10, 1.0)
    layers = {l.name: l for l in model.partitioned_layers()}
    assert list(layers) == ["b0.conv1", "b0.conv2", "b0.shortcut", "b1.conv1", "b1.conv2", "head"]
    stage4 = model.stages[3]
    assert layers["b0.shortcut"].module is stage4[0].shortcut and layers["b1.conv2"].module is stage4[1].conv2
    sets = {name: (l.in_set, l.out_set) for name, l in layers.items()}
    assert sets == {"b0.conv1": ("in", "b0.mid"), "b0.conv2": ("b0.mid", "b0.out"), "b0.shortcut": ("in", "b0.out"),
                    "b1.conv1": ("b0.out", "b1.mid"), "b1.conv2": ("b1.mid", "b0.out"), "head": ("b0.out", "classes")}
    assert model.split_batchnorms() == [stage4[0].bn1, stage4[0].bn2, stage4[1].bn1, stage4[1].bn2]


def test_resnet32_partitions_its_last_two_blocks_and_the_head():
    model = with_classes(create_model("resnet32", 10, 1.0), 20)
    layers = model.partitioned_layers()
    last_stage = model.stages[-1]
    assert [l.name for l in layers] == ["b0.conv1", "b0.conv2", "b1.conv1", "b1.conv2", "head"]
    assert layers[0].module is last_stage[3].conv1 and layers[3].module is last_stage[4].conv2
    assert all(b.shortcut is None for b in model.split_blocks_list())  # identity: outputs share the input's groups
    part = make_partition(model, 1.15, 10)  # bf = 0.575 of 64 channels
    assert part.width == {"in": 64, "b0.mid": 64, "b1.mid": 64, "classes": 20}
    assert part.old == {"in": 36, "b0.mid": 36, "b1.mid": 36, "classes": 10}
    assert model.split_batchnorms() == [last_stage[3].bn1, last_stage[3].bn2, last_stage[4].bn1, last_stage[4].bn2]


def test_cross_mask_marks_exactly_the_off_diagonal_blocks():
    model = small_net(num_classes=5)
    part = make_partition(model, 1.0, 3)  # bf 0.6
    for layer in model.partitioned_layers():
        mask = cross_mask(layer, part)
        o, i = part.old[layer.out_set], part.old[layer.in_set]
        assert mask.shape == layer.module.weight.shape
        assert torch.all(mask[:o, :i] == 0) and torch.all(mask[o:, i:] == 0)
        assert torch.all(mask[:o, i:] == 1) and torch.all(mask[o:, :i] == 1)


# --------------------------------------------------------------------------------------------
# Disconnect and bridge
# --------------------------------------------------------------------------------------------


def branch_parameters(model: IncrementalResNet, part, branch: str) -> list[tuple[torch.Tensor, slice]]:
    """(tensor, rows) of one branch: partitioned weights' output rows, split BN channels, head rows and bias."""
    pick = (lambda n, old: slice(0, old)) if branch == "old" else (lambda n, old: slice(old, n))
    out = []
    for layer in model.partitioned_layers():
        weight = layer.module.weight
        rows = pick(weight.shape[0], part.old[layer.out_set])
        out.append((weight, rows))
        if layer.name == "head":
            out.append((layer.module.bias, rows))
    for block in model.split_blocks_list():
        for bn, conv in ((block.bn1, block.conv1), (block.bn2, block.conv2)):
            owner = next(l for l in model.partitioned_layers() if l.module is conv)
            rows = pick(bn.weight.shape[0], part.old[owner.out_set])
            out += [(bn.weight, rows), (bn.bias, rows), (bn.running_mean, rows)]
    return out


@torch.no_grad()
def perturb(params: list[tuple[torch.Tensor, slice]]) -> None:
    for tensor, rows in params:
        tensor[rows] += torch.randn_like(tensor[rows])


@pytest.mark.parametrize("arch", ["resnet18", "resnet32"])
@pytest.mark.parametrize(("branch", "kept", "moved"), [("new", "old", "new"), ("old", "new", "old")])
def test_after_disconnect_one_branch_does_not_see_the_other(arch, branch, kept, moved):
    model = small_net(arch, num_classes=5)
    part = make_partition(model, 1.0, 3)
    disconnect(model, part)
    x = torch.randn(4, 3, 16, 16)
    z = split_input(model)
    cols = {"old": slice(0, 3), "new": slice(3, 5)}
    before_full, before_top = model(x), top_logits(model, z)
    perturb(branch_parameters(model, part, branch))
    after_full, after_top = model(x), top_logits(model, z)
    torch.testing.assert_close(after_full[:, cols[kept]], before_full[:, cols[kept]], rtol=0, atol=1e-5)
    torch.testing.assert_close(after_top[:, cols[kept]], before_top[:, cols[kept]], rtol=0, atol=1e-5)
    assert (after_top[:, cols[moved]] - before_top[:, cols[moved]]).abs().max() > 1e-2


@pytest.mark.parametrize("arch", ["resnet18", "resnet32"])
def test_after_disconnect_each_branch_reads_only_its_group_of_the_shared_channels(arch):
    model = small_net(arch, num_classes=5)
    part = make_partition(model, 1.0, 3)
    disconnect(model, part)
    z = split_input(model)
    old_in = part.old["in"]
    base = top_logits(model, z)
    z_new = z.clone()
    z_new[:, old_in:] += torch.randn_like(z_new[:, old_in:])
    z_old = z.clone()
    z_old[:, :old_in] += torch.randn_like(z_old[:, :old_in])
    torch.testing.assert_close(top_logits(model, z_new)[:, :3], base[:, :3], rtol=0, atol=1e-5)
    torch.testing.assert_close(top_logits(model, z_old)[:, 3:], base[:, 3:], rtol=0, atol=1e-5)
    assert (top_logits(model, z_new)[:, 3:] - base[:, 3:]).abs().max() > 1e-2


def test_disconnect_zeroes_the_cross_weights_and_masks_them():
    model = small_net(num_classes=5)
    part = make_partition(model, 1.0, 3)
    assert cross_norm(model, part) > 0
    disconnect(model, part)
    assert cross_norm(model, part) == 0
    x = torch.randn(2, 3, 16, 16)
    before = model(x)
    with torch.no_grad():  # masked cross weights have no effect even if something writes into them
        for layer in model.partitioned_layers():
            layer.module.weight.add_(cross_mask(layer, part) * 5.0)
    torch.testing.assert_close(model(x), before)
    enforce_masks(model)
    assert cross_norm(model, part) == 0


def test_bridge_keeps_the_function_and_frees_the_cross_weights():
    model = small_net(num_classes=5)
    part = make_partition(model, 1.0, 3)
    disconnect(model, part)
    x = torch.randn(4, 3, 16, 16)
    split_out = model(x)
    bridge(model)
    assert all(l.module.mask is None for l in model.partitioned_layers())
    assert cross_norm(model, part) == 0
    torch.testing.assert_close(model(x), split_out, rtol=0, atol=0)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 3, 4])).backward()
    opt.step()
    assert cross_norm(model, part) > 0  # the bridge weights learn


def test_bn_reset_resets_only_the_partitioned_batchnorms():
    model = small_net(num_classes=5)
    stage3_bn = model.stages[2][1].bn2.weight.clone()
    reset_split_batchnorms(model)
    for bn in model.split_batchnorms():
        assert torch.all(bn.weight == 1) and torch.all(bn.bias == 0)
        assert torch.all(bn.running_mean == 0) and torch.all(bn.running_var == 1)
    torch.testing.assert_close(model.stages[2][1].bn2.weight, stage3_bn)


# --------------------------------------------------------------------------------------------
# Sparsity penalties
# --------------------------------------------------------------------------------------------


def value(penalty, model: IncrementalResNet, part) -> float:
    with torch.no_grad():
        return float(penalty(model, part))


def own_and_cross_grad(model: IncrementalResNet, part, penalty) -> tuple[float, float]:
    """Squared gradient norms of the penalty on the non-cross and on the cross weights."""
    model.zero_grad()
    penalty(model, part).backward()
    own = cross = 0.0
    for layer in model.partitioned_layers():
        grad, mask = layer.module.weight.grad, cross_mask(layer, part)
        own += float((grad * (1 - mask)).pow(2).sum())
        cross += float((grad * mask).pow(2).sum())
    return own, cross


def test_paper_penalty_is_zero_without_cross_weights_and_only_moves_them():
    model = small_net(num_classes=5)
    part = make_partition(model, 1.0, 3)
    assert value(sparsity_paper, model, part) > 0
    own, cross = own_and_cross_grad(model, part, sparsity_paper)
    assert own == 0 and cross > 0
    disconnect(model, part)
    bridge(model)
    model.zero_grad()
    at_zero = sparsity_paper(model, part)
    assert at_zero.item() == 0
    at_zero.backward()  # the gradient at zero is finite (zero)
    assert all(torch.isfinite(l.module.weight.grad).all() for l in model.partitioned_layers())


def test_paper_penalty_is_the_sum_of_the_cross_block_norms():
    model = small_net(num_classes=5)
    part = make_partition(model, 1.0, 3)
    expected = 0.0
    for layer in model.partitioned_layers():
        w, o, i = layer.module.weight.detach(), part.old[layer.out_set], part.old[layer.in_set]
        expected += float(w[:o, i:].norm()) + float(w[o:, :i].norm())
    assert value(sparsity_paper, model, part) == pytest.approx(expected, rel=1e-5)


def test_code_penalty_falls_without_cross_weights_and_mostly_moves_them():
    model = small_net(num_classes=5)
    part = make_partition(model, 1.0, 3)
    dense = value(sparsity_code, model, part)
    own, cross = own_and_cross_grad(model, part, sparsity_code)
    assert cross > 20 * own > 0  # soft memberships: own-group weights get a little gradient too
    disconnect(model, part)
    bridge(model)
    assert 0 < value(sparsity_code, model, part) < 0.1 * dense


def authors_group_lasso(weight: torch.Tensor, old_out: int, old_in: int) -> float:
    """The authors' per-tensor split loss, transcribed from the formula of their code (two groups).

    w2 = mean over the kernel of w^2 (w itself for a linear layer, squared after weighting); q:
    output memberships, p: input memberships, both softmax([2, -2]); for each group i, per input
    column: sqrt(sum_o w2 q_i(o)^2 (1 - p_i(j))^2) summed, over C_in sqrt(C_out); per output row:
    sqrt(sum_j w2 (1 - q_i(o))^2 p_i(j)^2) summed, over C_out sqrt(C_in); all over sqrt(1 / fan_in).
    """
    c_out, c_in = weight.shape[:2]
    w2 = weight.pow(2).mean(dim=(2, 3)) if weight.ndim == 4 else weight.pow(2)
    kernel = weight.shape[-1] if weight.ndim == 4 else 1
    std = math.sqrt(1.0 / (kernel**2) / c_in)
    total = 0.0
    for group in (0, 1):
        q = torch.tensor([SOFT_OWN if (o < old_out) == (group == 0) else 1 - SOFT_OWN for o in range(c_out)])
        p = torch.tensor([SOFT_OWN if (j < old_in) == (group == 0) else 1 - SOFT_OWN for j in range(c_in)])
        col = (w2 * q[:, None] ** 2 * (1 - p[None, :]) ** 2).sum(0).sqrt().sum() / (c_in * math.sqrt(c_out))
        row = (w2 * (1 - q[:, None]) ** 2 * p[None, :] ** 2).sum(1).sqrt().sum() / (c_out * math.sqrt(c_in))
        total += float(col + row)
    return total / std


def test_code_penalty_per_tensor_matches_the_authors_formula():
    model = small_net(num_classes=7)
    part = make_partition(model, 1.35, 4)
    kinds = set()
    for layer in model.partitioned_layers():
        weight = layer.module.weight
        kinds.add(tuple(weight.shape[2:]))
        expected = authors_group_lasso(weight.detach(), part.old[layer.out_set], part.old[layer.in_set])
        assert value(lambda m, pt: group_lasso(layer, pt), model, part) == pytest.approx(expected, rel=1e-4), layer.name
    assert kinds == {(3, 3), (1, 1), ()}  # 3x3 convs, the 1x1 shortcut and the head


def test_code_penalty_is_the_self_weighted_mean_of_the_tensors():
    model = small_net(num_classes=5)
    part = make_partition(model, 1.0, 3)
    values = [value(lambda m, pt: group_lasso(l, pt), model, part) for l in model.partitioned_layers()]
    assert len(values) == 6
    expected = sum(v * v for v in values) / sum(values)
    assert value(sparsity_code, model, part) == pytest.approx(expected, rel=1e-5)
