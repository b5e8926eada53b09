import math

import numpy as np
import torch

from sbcli.metrics import accuracy_matrix, average_incremental, forgetting, step_metrics, summary


def test_averages_over_2_to_T_and_1_to_T():
    assert average_incremental([90.0, 70.0, 50.0]) == 60.0
    assert average_incremental([90.0, 70.0, 50.0], skip_first=False) == 70.0


def test_forgetting_is_the_mean_drop_from_the_best_earlier_accuracy():
    acc = accuracy_matrix([[90.0], [80.0, 70.0], [60.0, 65.0, 88.0]])
    assert np.isnan(acc[0, 1])
    assert math.isclose(forgetting(acc), ((90 - 60) + (70 - 65)) / 2)
    assert math.isnan(summary([90.0], [[90.0]]).forgetting)


def test_forgetting_leaves_out_a_task_with_no_value_at_the_last_step():
    nan = float("nan")  # task 1's classes all taken out at step 3 (sb forget): its column ends empty
    acc = accuracy_matrix([[90.0], [80.0, 70.0], [nan, 65.0, nan]])
    assert math.isclose(forgetting(acc), 70 - 65)


def test_old_new_and_intra_accuracies():
    task_of_class = [0, 0, 1, 1]
    labels = torch.tensor([0, 1, 2, 3])
    # image 0: right overall; image 1: predicted as new class 2 but old argmax right;
    # image 2: right; image 3: predicted as old class 0, new argmax right
    scores = torch.tensor([[9.0, 0, 0, 0], [0, 5.0, 9.0, 0], [0, 0, 9.0, 0], [9.0, 0, 1.0, 5.0]])
    m = step_metrics(scores, labels, task_of_class)
    assert (m.overall, m.old, m.new) == (50.0, 50.0, 50.0)
    assert (m.intra_old, m.intra_new) == (100.0, 100.0)
    assert m.per_task == [50.0, 50.0]


def test_strict_json_turns_missing_values_into_null():
    from sbcli.jsonutil import strict

    data = {"a": [1.0, float("nan"), float("inf")], "b": "x", "c": (2, {"d": float("-inf")})}
    assert strict(data) == {"a": [1.0, None, None], "b": "x", "c": [2, {"d": None}]}


def test_accuracies_are_exact_fractions_of_their_counts():
    """190 of 1,000 right is 19.0 (a float32 mean said 18.99999976158142), and the counts are kept."""
    import torch

    from sbcli.metrics import step_metrics

    labels = torch.zeros(1000, dtype=torch.long)
    scores = torch.zeros(1000, 2)
    scores[190:, 1] = 1.0  # 190 right, 810 wrong
    metrics = step_metrics(scores, labels, [0, 0])
    assert metrics.overall == 19.0 and repr(metrics.overall) == "19.0"
    assert metrics.to_json()["counts"]["overall"] == [190, 1000]
    assert metrics.to_json()["counts"]["per_task"] == [[190, 1000]]
