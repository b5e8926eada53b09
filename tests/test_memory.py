import pytest
import torch

from sbcli.errors import ConfigError
from sbcli.methods.memory import ExemplarMemory, class_quotas, herding_order


@pytest.mark.parametrize("budget,classes", [(2000, 30), (2000, 10), (2000, 100), (2000, 7), (20, 3)])
def test_quotas_sum_to_the_budget(budget, classes):
    quotas = class_quotas(budget, classes)
    assert sum(quotas) == budget and len(quotas) == classes
    assert max(quotas) - min(quotas) <= 1 and max(quotas) == -(-budget // classes)


def _task(labels: list[int], per_class: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.tensor([c for c in labels for _ in range(per_class)])
    x = torch.arange(len(y), dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 3, 2, 2).contiguous()
    return x, y


@pytest.mark.parametrize("selection", ["random", "first", "herding"])
def test_memory_keeps_the_budget_and_shrinks_old_classes_by_keeping_their_first(selection):
    feats = lambda x: x[:, 0, 0, :].float() + torch.randn(len(x), 2, generator=torch.Generator().manual_seed(0))
    memory = ExemplarMemory(budget=20, selection=selection, seed=3)
    memory.update(*_task([0, 1]), num_seen=2, features=feats)
    assert memory.per_class_counts() == {0: 10, 1: 10}
    first_of_0 = memory.images[memory.labels == 0][:5].clone()
    memory.update(*_task([2, 3]), num_seen=4, features=feats)
    assert memory.per_class_counts() == {0: 5, 1: 5, 2: 5, 3: 5}
    assert torch.equal(memory.images[memory.labels == 0], first_of_0)


def test_first_takes_dataset_order_and_random_is_seeded():
    x, y = _task([0])
    first = ExemplarMemory(5, "first")
    first.update(x, y, 1)
    assert first.images[:, 0, 0, 0].tolist() == [0, 1, 2, 3, 4]
    a, b, c = ExemplarMemory(5, "random", seed=1), ExemplarMemory(5, "random", seed=1), ExemplarMemory(5, "random", seed=2)
    for m in (a, b, c):
        m.update(x, y, 1)
    assert torch.equal(a.images, b.images) and not torch.equal(a.images, c.images)


def test_herding_picks_the_sample_at_the_mean_first():
    feats = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.7071, 0.7071], [1.0, 0.1]])
    assert int(herding_order(feats, 1)[0]) == 2


def test_bad_selection_is_refused():
    with pytest.raises(ConfigError, match="herding"):
        ExemplarMemory(10, "best")
