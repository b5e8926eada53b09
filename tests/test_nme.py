"""iCaRL's nearest mean of exemplars: class means, scoring by the nearest one, and the learner state."""

from pathlib import Path

import pytest
import torch

from sbcli import api
from sbcli.engine.loop import Engine, StepOutputs, TrainConfig
from sbcli.errors import ConfigError, ExportError
from sbcli.learner.state import Learner
from sbcli.methods.rules import class_means as nme
from sbcli.methods.inference import scoring_module
from sbcli.methods.losses import ce_loss, kd_loss
from sbcli.methods.rules.scoring_modules import NearestMeanScores
from sbcli.methods.rules.nme import MEANS_KEY as NME_MEANS
from sbcli.methods.std import icarl_loss
from sbcli.nets import create_model
from sbcli.run import evalsets


class Features(torch.nn.Module):
    """A stand-in network whose pooled features are its input."""

    num_classes, num_features = 3, 2

    def __init__(self) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_scores_are_negative_squared_distances_to_unit_means():
    means = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]), dim=1)
    feats = torch.tensor([[5.0, 0.5], [0.2, 3.0], [-2.0, -1.5]])
    got = NearestMeanScores(Features(), means)(feats)
    unit = torch.nn.functional.normalize(feats, dim=1)
    torch.testing.assert_close(got, -torch.cdist(unit, means) ** 2, rtol=1e-5, atol=1e-5)
    assert got.argmax(1).tolist() == [0, 1, 2]


def test_icarl_reads_the_means_the_method_stores():
    assert nme.MEANS_KEY == NME_MEANS


def channel_means(images: torch.Tensor) -> torch.Tensor:
    """A flip-invariant feature: the mean of each channel, plus a constant."""
    x = images.float().mean(dim=(2, 3))
    return torch.cat([x, torch.full((len(x), 1), 10.0)], dim=1)


def test_class_means_average_normalised_features_of_each_class():
    images = torch.zeros(6, 3, 4, 4, dtype=torch.uint8)
    images[:3, 0] = 200  # class 0: red
    images[3:, 2] = 100  # class 1: blue
    labels = torch.tensor([0, 0, 0, 1, 1, 1])
    means = nme.class_means(channel_means, images, labels, 2)
    expected = torch.nn.functional.normalize(channel_means(images[[0, 3]]), dim=1)
    torch.testing.assert_close(means, expected)
    with pytest.raises(ConfigError, match="--memory"):
        nme.class_means(channel_means, images, labels, 3)


def test_classifier_module_scores_by_nearest_mean_of_the_features():
    torch.manual_seed(0)
    model = create_model("resnet18", 3, 0.125).eval()
    x = torch.randn(8, 3, 16, 16)
    with torch.no_grad():
        feats = model.forward_features(x)
    means = torch.nn.functional.normalize(feats[[1, 4, 6]], dim=1)  # make samples 1, 4, 6 the class means
    module = scoring_module(model, {nme.MEANS_KEY: means}, "icarl").eval()
    with torch.no_grad():
        scores = module(x)
    dist = torch.cdist(torch.nn.functional.normalize(feats, dim=1), means)
    assert scores.argmax(1).tolist() == dist.argmin(1).tolist()
    assert scores[[1, 4, 6]].argmax(1).tolist() == [0, 1, 2]
    with pytest.raises(ExportError, match="class means"):
        scoring_module(model, {nme.MEANS_KEY: means[:2]}, "icarl")


def test_icarl_loss_is_ce_plus_kd_unweighted():
    torch.manual_seed(0)
    logits, teacher = torch.randn(6, 5), torch.randn(6, 3)
    targets = torch.tensor([0, 1, 2, 3, 4, 3])
    out = StepOutputs(None, None, targets, logits, teacher)
    torch.testing.assert_close(icarl_loss(out), ce_loss(logits, targets) + kd_loss(logits[:, :3], teacher))


@pytest.fixture(scope="module")
def icarl_learner(four_colors, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nme")
    train, test = four_colors["train"], four_colors["test"]
    run = api.RunOptions(method="std", method_options={"inference": "icarl"}, width=0.125,
                         train=TrainConfig(epochs=1, batch_size=16), memory=12, device="cpu")
    seq = api.SequenceOptions(source=str(train), test=str(test), image_size=16, tasks=2)
    out = root / "icarl"
    api.train(seq, run, out)
    return out


def test_icarl_learner_keeps_the_means_of_its_final_memory(icarl_learner):
    learner = Learner.load(icarl_learner)
    means = learner.extra[nme.MEANS_KEY]
    assert means.shape == (4, learner.model.num_features)
    engine = Engine(TrainConfig(), torch.device("cpu"), learner.norm, 0)
    images, labels = learner.memory.tensors()
    assert torch.bincount(labels).tolist() == [3, 3, 3, 3]
    again = nme.class_means(lambda x: engine.features(learner.model, x), images, labels, 4)
    torch.testing.assert_close(means, again, rtol=1e-4, atol=1e-5)


def test_icarl_evaluation_uses_the_nearest_mean(icarl_learner):
    learner = Learner.load(icarl_learner)
    engine = Engine(TrainConfig(), torch.device("cpu"), learner.norm, 0)
    test = evalsets.load_test_sets(learner)
    feats = engine.features(learner.model, test.images)
    nearest = torch.cdist(torch.nn.functional.normalize(feats, dim=1), learner.extra[nme.MEANS_KEY]).argmin(1)
    expected = float((nearest == test.labels).float().mean()) * 100
    assert api.evaluate(icarl_learner, device="cpu").metrics.overall == pytest.approx(expected)


def test_icarl_history_records_the_network_output_beside_the_nearest_mean(icarl_learner):
    learner = Learner.load(icarl_learner)
    engine = Engine(TrainConfig(), torch.device("cpu"), learner.norm, 0)
    test = evalsets.load_test_sets(learner)
    last = learner.state.history[-1]
    network = float((engine.logits(learner.model, test.images).argmax(1) == test.labels).float().mean()) * 100
    assert last.network_metrics.overall == pytest.approx(network)
    assert last.metrics.overall == pytest.approx(api.evaluate(icarl_learner, device="cpu").metrics.overall)
    assert all(h.network_metrics is not None and set(h.network_metrics.to_json()) == set(h.metrics.to_json())
               for h in learner.state.history)
