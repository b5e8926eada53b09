"""--method simplecil's softmax scale: fitted on held-out cosines it turns near-uniform probabilities into
calibrated ones, never changes a prediction, is stored in the learner, and a learner saved without it
still scores with the plain cosines."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import PALETTE, write_class_folder
from torch import nn

from sbcli import api
from sbcli.engine.loop import TrainConfig
from sbcli.errors import ExportError
from sbcli.learner.state import Learner
from sbcli.methods import simplecil
from sbcli.methods.rules.scoring_modules import prototype_module
from sbcli.methods.simplecil import (
    PROTOTYPES_KEY,
    SCALE_KEY,
    SCALES,
    class_prototypes,
    fit_scale,
    held_out_cosines,
    step_features,
)

pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = 16


class FeatureNet(nn.Module):
    """A network whose "images" are already its pooled features (the scoring module's contract, nothing else)."""

    def __init__(self, num_classes: int, num_features: int) -> None:
        super().__init__()
        self.num_classes, self.num_features = num_classes, num_features
        self.unused = nn.Parameter(torch.zeros(1))  # the module reads the device from a parameter

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return x


def blobs(centres: torch.Tensor, per_class: int, noise: float, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Gaussian features around each class centre, and their labels."""
    labels = torch.arange(len(centres)).repeat_interleave(per_class)
    return centres[labels] + noise * torch.randn(len(labels), centres.shape[1], generator=gen), labels


def top(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The softmax's top probability and its class, per row."""
    return scores.softmax(1).max(1)


def test_the_scale_calibrates_twenty_classes_without_changing_a_prediction(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(20, 64, generator=gen)
    train, train_y = blobs(centres, 40, 2.6, gen)
    test, test_y = blobs(centres, 40, 2.6, gen)  # images the prototypes never saw
    feats = nn.functional.normalize(train, dim=1)
    protos = class_prototypes(feats, train_y, range(20))
    scale = fit_scale(feats, train_y, protos, feats, range(20))
    assert scale in SCALES and scale > 1
    monkeypatch.setattr(simplecil, "FIT_IMAGES", 200)  # every 4th image: about the same scale
    assert 2 ** -0.5 <= fit_scale(feats, train_y, protos, feats, range(20)) / scale <= 2 ** 0.5

    net = FeatureNet(20, 64).eval()
    with torch.no_grad():
        plain = prototype_module(net, {PROTOTYPES_KEY: protos}, PROTOTYPES_KEY, SCALE_KEY)(test)
        scaled = prototype_module(net, {PROTOTYPES_KEY: protos, SCALE_KEY: torch.tensor([scale])},
                                  PROTOTYPES_KEY, SCALE_KEY)(test)
    (p_plain, y_plain), (p_scaled, y_scaled) = top(plain), top(scaled)
    assert torch.equal(y_plain, y_scaled)  # the same predictions, so the same accuracy
    accuracy = float((y_scaled == test_y).float().mean())
    print(f"\n20 classes, scale {scale:g}, accuracy {accuracy:.3f}: mean top probability "
          f"{float(p_plain.mean()):.3f} plain -> {float(p_scaled.mean()):.3f} scaled")
    assert 0.6 < accuracy < 0.95  # hard enough that confidence has something to match
    assert float(p_plain.mean()) < 2 / 20  # the plain cosines: near uniform (1 / 20)
    # calibrated on held-out data: the confidence tracks the accuracy, and the likelihood is far better
    assert abs(float(p_scaled.mean()) - accuracy) < 0.1
    nll = nn.functional.cross_entropy
    assert float(nll(scaled, test_y)) < 0.5 * float(nll(plain, test_y))


def test_leave_one_out_scores_an_image_against_its_class_without_it():
    feats = nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [0.8, 0.6]]), dim=1)
    labels = torch.tensor([0, 0, 1, 2])  # class 2 is an old class (an exemplar), 0 and 1 are new
    protos = torch.cat([class_prototypes(feats[:3], labels[:3], range(0, 2)), torch.tensor([[1.0, 0.0]])])
    scores = held_out_cosines(feats, labels, protos, feats[:3], torch.tensor([2, 1]), range(0, 2))
    # image 0 against class 0 without itself is image 1's feature; class 1 has one image and keeps its prototype
    torch.testing.assert_close(scores[0, 0], feats[0] @ feats[1])
    torch.testing.assert_close(scores[2, 1], torch.tensor(1.0))
    torch.testing.assert_close(scores[3], feats[3] @ nn.functional.normalize(protos, dim=1).T)  # old: as stored
    torch.testing.assert_close(scores[0, 1:], feats[0] @ nn.functional.normalize(protos[1:], dim=1).T)


def test_a_stored_scale_that_is_not_one_positive_number_is_refused():
    net = FeatureNet(2, 3)
    protos = torch.eye(3)[:2]
    for bad in (torch.tensor([0.0]), torch.tensor([-2.0]), torch.tensor([1.0, 2.0])):
        with pytest.raises(ExportError, match="not one positive number"):
            prototype_module(net, {PROTOTYPES_KEY: protos, SCALE_KEY: bad}, PROTOTYPES_KEY, SCALE_KEY)


@pytest.fixture(scope="module")
def six_colours(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("six-colours")
    return {"train": write_class_folder(root / "train", list(PALETTE), 24, seed=1),
            "test": write_class_folder(root / "test", list(PALETTE), 8, seed=2)}


@pytest.fixture(scope="module")
def calibrated(six_colours, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tasks of three colours on a random frozen ResNet, exemplars kept (they join the second fit)."""
    out = tmp_path_factory.mktemp("calibrated") / "learner"
    run = api.RunOptions(method="simplecil", width=0.125, pretrained="random", memory=12, device="cpu",
                         train=TrainConfig(epochs=1, batch_size=16))
    seq = api.SequenceOptions(source=str(six_colours["train"]), test=str(six_colours["test"]), image_size=SIZE, tasks=2)
    api.train(seq, run, out)
    return out


def test_a_learner_without_the_scale_scores_the_plain_cosines_with_the_same_accuracy(calibrated, six_colours, tmp_path):
    learner = Learner.load(calibrated, "cpu")
    scale = learner.extra[SCALE_KEY]
    assert scale.dtype == torch.float32 and scale.shape == (1,) and float(scale) > 1
    assert [h.record["scale"] for h in learner.state.history][-1] == float(scale)  # the step records its fit
    assert len(learner.memory) == 12 and learner.extra[PROTOTYPES_KEY].shape[0] == 6

    # the learner as an older release saved it: no scale among its tensors
    del learner.extra[SCALE_KEY]
    old = tmp_path / "old"
    learner.save(old)
    assert SCALE_KEY not in Learner.load(old, "cpu").extra
    shutil.copytree(calibrated, tmp_path / "new")  # and the new one saved again elsewhere: the scale round-trips
    assert torch.equal(Learner.load(tmp_path / "new", "cpu").extra[SCALE_KEY], scale)

    images = sorted(six_colours["test"].rglob("*.png"))
    before, after = api.predict(old, images, top_k=1, device="cpu"), api.predict(tmp_path / "new", images, top_k=1,
                                                                                  device="cpu")
    assert [p.labels for p in before] == [p.labels for p in after]  # the same predictions
    p_before = sum(p.probabilities[0] for p in before) / len(images)
    p_after = sum(p.probabilities[0] for p in after) / len(images)
    acc = [api.evaluate(d, six_colours["test"], device="cpu").metrics for d in (old, tmp_path / "new")]
    assert acc[0] == acc[1]
    print(f"\n6 colours, scale {float(scale):g}, accuracy {acc[1].overall:.1f} %: mean top probability "
          f"{p_before:.3f} without the scale -> {p_after:.3f} with it")
    assert p_before < 1.5 / 6 and p_after > 2 * p_before


def test_flipped_terms_belong_to_the_new_classes_only():
    class Engine:  # the features of an "image" are its pixels, flattened
        def frozen_features(self, model, images):
            return images.flatten(1).float()

    images = torch.tensor([[[[1.0, 2.0]]], [[[3.0, 1.0]]], [[[0.0, 1.0]]]])  # [3, 1, 1, 2]
    labels = torch.tensor([0, 1, 1])  # class 0 is an exemplar's
    feats, terms = step_features(Engine(), None, images, labels, range(1, 2), flips=True)
    norm = nn.functional.normalize
    torch.testing.assert_close(feats, norm(images.flatten(1), dim=1))  # every image, unflipped: what scoring sees
    torch.testing.assert_close(terms, norm(feats[1:] + norm(images[1:].flip(-1).flatten(1), dim=1), dim=1))
