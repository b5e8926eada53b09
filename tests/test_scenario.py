import pytest

from sbcli.data.scenario import class_order, make_scenario, task_sizes
from sbcli.errors import ConfigError


def test_class_order_is_numpy_randomstate_shuffle():
    import numpy as np

    expected = np.arange(100)
    np.random.RandomState(1993).shuffle(expected)
    assert class_order(100, 1993) == expected.tolist()
    assert class_order(100, 0) != class_order(100, 1993)
    assert sorted(class_order(100, 0)) == list(range(100))
    assert class_order(5, None) == [0, 1, 2, 3, 4]


def test_task_sizes_equal_and_base_plus_increment():
    assert task_sizes(100, tasks=10) == [10] * 10
    assert task_sizes(100, base=50, increment=10) == [50, 10, 10, 10, 10, 10]


@pytest.mark.parametrize("kwargs", [{"tasks": 3}, {"base": 50, "increment": 7}, {"base": 0}])
def test_task_sizes_that_do_not_divide_are_refused(kwargs):
    with pytest.raises(ConfigError, match="100"):
        task_sizes(100, **kwargs)


def test_scenario_tasks_cut_the_order():
    s = make_scenario(10, seed=0, tasks=5)
    assert [c for t in s.tasks for c in t] == s.order
    assert all(len(t) == 2 for t in s.tasks)
    with pytest.raises(ConfigError, match="permutation"):
        make_scenario(4, seed=0, tasks=2, order=[0, 1, 1, 3])
