"""BiC: the bias layer learns a toy imbalance, folds into the head exactly, and runs end to end."""


import pytest
import torch

from sbcli import api
from sbcli.data.device import DeviceData
from sbcli.engine.loop import TrainConfig
from sbcli.errors import ConfigError
from sbcli.learner.state import Learner
from sbcli.methods import bic_training as bic
from sbcli.methods.base import TaskContext
from sbcli.methods.inference import scoring_module
from sbcli.nets import create_model


def imbalanced_logits(n_per_class: int, num_old: int, num_new: int, new_boost: float, seed: int = 0):
    """Logits whose true class leads by 3, with every new class's logit inflated by ``new_boost``."""
    gen = torch.Generator().manual_seed(seed)
    classes = num_old + num_new
    labels = torch.arange(classes).repeat_interleave(n_per_class)
    logits = torch.randn(len(labels), classes, generator=gen) + 3.0 * torch.nn.functional.one_hot(labels, classes)
    logits[:, num_old:] += new_boost
    return logits, labels


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float((logits.argmax(1) == labels).float().mean())


def test_bias_layer_learns_a_toy_imbalance():
    logits, labels = imbalanced_logits(50, num_old=4, num_new=4, new_boost=4.0)
    before = accuracy(logits, labels)
    alpha, beta = bic.fit_bias_layer(logits, labels, 4, bic.BiasTraining())
    corrected = bic.bias_correct(logits, 4, alpha, beta)
    old = labels < 4
    assert before < 0.6  # the boost makes most old-class samples go to new classes
    assert accuracy(corrected, labels) > before + 0.3
    assert accuracy(corrected[old], labels[old]) > 0.85
    assert alpha * 3.0 + beta < 3.0 - 2.0  # the new logits are pulled down by most of the boost


def test_bias_layer_does_not_hurt_balanced_logits():
    logits, labels = imbalanced_logits(50, num_old=4, num_new=4, new_boost=0.0)
    alpha, beta = bic.fit_bias_layer(logits, labels, 4, bic.BiasTraining())
    assert accuracy(bic.bias_correct(logits, 4, alpha, beta), labels) >= accuracy(logits, labels) - 0.02


def test_fold_gives_the_bias_layer_outputs_and_leaves_the_model_alone():
    torch.manual_seed(0)
    model = create_model("resnet18", 6, 0.125).eval()
    with torch.no_grad():
        model.head.bias.normal_()
    extra = bic.correction_state(6, 4, alpha=0.7, beta=-1.3, history=None)
    x = torch.randn(5, 3, 16, 16)
    plain_before = model(x).detach()
    folded = scoring_module(model, extra, "bic").eval()
    expected = bic.bias_correct(model(x), 4, 0.7, -1.3)
    torch.testing.assert_close(folded(x), expected, rtol=1e-5, atol=1e-5)
    assert isinstance(folded, type(model))  # a plain network: nothing new to export
    assert torch.equal(model(x), plain_before)


def test_correction_state_keeps_every_steps_alpha_beta():
    first = bic.correction_state(4, 2, 0.9, -0.5, None)
    second = bic.correction_state(6, 4, 0.8, -1.0, first[bic.STEPS_KEY])
    torch.testing.assert_close(second[bic.STEPS_KEY], torch.tensor([[0.9, -0.5], [0.8, -1.0]]))
    assert second[bic.SCALE_KEY].tolist() == pytest.approx([1, 1, 1, 1, 0.8, 0.8])
    assert second[bic.SHIFT_KEY].tolist() == pytest.approx([0, 0, 0, 0, -1.0, -1.0])


def test_carve_validation_is_class_balanced_and_held_out():
    labels = torch.tensor([0] * 5 + [1] * 7 + [2] * 9)
    images = torch.arange(len(labels), dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 3, 2, 2).contiguous()
    rest, val = bic.carve_validation(DeviceData(images, labels), 3, 2, torch.Generator().manual_seed(0))
    assert torch.bincount(val.labels).tolist() == [2, 2, 2]
    ids_val, ids_rest = set(val.images[:, 0, 0, 0].tolist()), set(rest.images[:, 0, 0, 0].tolist())
    assert not ids_val & ids_rest and len(ids_val | ids_rest) == len(labels)
    with pytest.raises(ConfigError, match="raise --memory"):
        bic.carve_validation(DeviceData(images, labels), 3, 5, torch.Generator())


def test_validation_size_is_a_tenth_of_the_quota():
    assert bic.validation_per_class(2000, 100, 0.1) == 2  # BiC's own setting: 20 per class, split 9:1
    assert bic.validation_per_class(2000, 200, 0.1) == 1
    assert bic.validation_per_class(20, 10, 0.1) == 1


class _Capture:
    """An engine stand-in that records the phase it was asked to run and trains nothing."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(0)
        self.phases = []

    def run(self, model, data, phase):
        self.phases.append((phase, data))
        from sbcli.engine.loop import PhaseReport

        return PhaseReport(phase.name, phase.epochs, 0.0, 0.0, 0.0)

    def logits(self, model, images):
        with torch.no_grad():
            return model.eval()(images.float() / 255.0)


def test_previous_bias_layer_corrects_the_teacher():
    torch.manual_seed(0)
    teacher = create_model("resnet18", 4, 0.125).eval()
    model = create_model("resnet18", 6, 0.125)
    previous = bic.correction_state(4, 2, alpha=0.5, beta=-2.0, history=None)
    labels = torch.arange(6).repeat_interleave(4)
    images = torch.randint(0, 255, (len(labels), 3, 8, 8), dtype=torch.uint8)
    engine = _Capture()
    ctx = TaskContext(step=2, model=model, teacher=teacher, data=DeviceData(images, labels), num_old=4, num_total=6,
                      engine=engine, epochs=1, evaluate=lambda: None, extra=previous, memory_budget=40)
    result = bic.learn_bic_step(ctx, bic.BiasTraining(iterations=5))
    phase, train = engine.phases[0]
    x = torch.randn(3, 3, 8, 8)
    torch.testing.assert_close(phase.teacher(x), bic.bias_correct(teacher(x), 2, 0.5, -2.0), rtol=1e-5, atol=1e-5)
    assert len(train) == len(labels) - 6  # one validation image per class held out of the training
    assert result.extra_state[bic.STEPS_KEY].shape == (2, 2)
    assert result.extra_state[bic.SCALE_KEY].shape == (6,)


def test_std_bic_learner_keeps_its_correction_and_loads_it(four_colors, tmp_path):
    out = tmp_path / "bic"
    run = api.RunOptions(method="std", method_options={"inference": "bic"}, width=0.125,
                         train=TrainConfig(epochs=1, batch_size=16), memory=40, device="cpu")
    seq = api.SequenceOptions(source=str(four_colors["train"]), test=str(four_colors["test"]), image_size=16, tasks=2)
    learner = api.train(seq, run, out)
    record = learner.state.history[1].record
    assert {"bic_alpha", "bic_beta", "bic_val_accuracy_after"} <= set(record)
    assert record["bic_val_per_class"] == 1
    loaded = Learner.load(out)
    assert set(loaded.extra) == {bic.SCALE_KEY, bic.SHIFT_KEY, bic.STEPS_KEY}
    assert loaded.extra[bic.SCALE_KEY][2:].tolist() == pytest.approx([record["bic_alpha"]] * 2)
    assert set(loaded.model.state_dict()) == set(create_model("resnet18", 4, 0.125).state_dict())
    evaluated = api.evaluate(out, device="cpu")
    assert evaluated.metrics.overall == pytest.approx(learner.state.history[-1].metrics.overall)


def test_bic_refuses_a_memory_too_small_to_hold_out(four_colors, tmp_path):
    run = api.RunOptions(method="std", method_options={"inference": "bic"}, width=0.125,
                         train=TrainConfig(epochs=1, batch_size=16), memory=2, device="cpu")
    seq = api.SequenceOptions(source=str(four_colors["train"]), test=str(four_colors["test"]), image_size=16, tasks=2)
    with pytest.raises(ConfigError, match="--memory"):
        api.train(seq, run, tmp_path / "bic")
