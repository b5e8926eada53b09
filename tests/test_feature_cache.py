"""The feature cache of frozen backbones: a step pays the backbone's forward pass for images it has not met;
what is read back is what would have been computed; a changed backbone or image misses; a damaged or
unwritable cache only costs time."""

from __future__ import annotations

import logging

import pytest
import torch

from sbcli import api
from sbcli.data.device import Normalization
from sbcli.engine.feature_cache import FeatureCache, backbone_fingerprint
from sbcli.engine.loop import Engine, TrainConfig
from sbcli.learner.state import Learner
from sbcli.nets import create_model
from sbcli.run.evaluation import evaluate_learner

pytestmark = pytest.mark.usefixtures("one_thread")
CONTEXT = {"norm": Normalization().to_json(), "device": "cpu"}


class Counting:
    """The backbone's features, counting the images it was asked for."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.images = model.eval(), 0

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        self.images += len(images)
        return self.model.forward_features(images.float() / 255)


def images_of(classes: int, per_class: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (classes * per_class, 3, 16, 16), dtype=torch.uint8, generator=gen)
    return images, torch.arange(classes).repeat_interleave(per_class)


@pytest.fixture
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("resnet18", 3, 0.125).eval()


def test_a_second_pass_computes_nothing_and_reads_back_what_was_computed(model, tmp_path):
    cache, compute = FeatureCache(tmp_path), Counting(model)
    images, labels = images_of(3, 5)
    first = cache.features(model, images, labels, CONTEXT, compute)
    assert compute.images == 15
    again = cache.features(model, images, labels, CONTEXT, compute)
    assert compute.images == 15 and torch.equal(first, again)
    torch.testing.assert_close(first, compute(images))


def test_only_new_or_changed_classes_are_computed(model, tmp_path):
    cache, compute = FeatureCache(tmp_path), Counting(model)
    images, labels = images_of(3, 5)
    cache.features(model, images, labels, CONTEXT, compute)
    more, more_labels = images_of(2, 4, seed=1)  # two new classes joined after the old ones
    joined, joined_labels = torch.cat([images, more]), torch.cat([labels, more_labels + 3])
    joined[0, 0, 0, 0] ^= 1  # one image of class 0 changed by one bit
    out = cache.features(model, joined, joined_labels, CONTEXT, compute)
    assert compute.images == 15 + 5 + 8  # class 0 again, the two new classes; classes 1 and 2 read back
    torch.testing.assert_close(out, compute(joined))


def test_another_backbone_head_aside_or_device_misses(model, tmp_path):
    cache, compute = FeatureCache(tmp_path), Counting(model)
    images, labels = images_of(2, 4)
    cache.features(model, images, labels, CONTEXT, compute)
    before = backbone_fingerprint(model)
    model.expand_classes(2)  # the growing head is not what features depend on
    assert backbone_fingerprint(model) == before
    cache.features(model, images, labels, CONTEXT, compute)
    assert compute.images == 8
    cache.features(model, images, labels, {**CONTEXT, "device": "cuda"}, compute)
    assert compute.images == 16
    with torch.no_grad():
        next(model.parameters()).add_(1e-3)
    assert backbone_fingerprint(model) != before
    out = cache.features(model, images, labels, CONTEXT, compute)
    assert compute.images == 24
    torch.testing.assert_close(out, compute(images))


def test_a_damaged_entry_is_computed_again(model, tmp_path, caplog):
    cache, compute = FeatureCache(tmp_path), Counting(model)
    images, labels = images_of(2, 4)
    cache.features(model, images, labels, CONTEXT, compute)
    entry = sorted(tmp_path.glob("*.safetensors"))[0]
    entry.write_bytes(entry.read_bytes()[:40])
    with caplog.at_level(logging.WARNING):
        out = cache.features(model, images, labels, CONTEXT, compute)
    assert compute.images == 12 and "unreadable" in caplog.text
    torch.testing.assert_close(out, compute(images))
    cache.features(model, images, labels, CONTEXT, compute)
    assert compute.images == 20  # 12 and the 8 of the check above: the entry was written again


def test_a_cache_that_cannot_be_written_only_costs_time(model, tmp_path, caplog):
    blocked = tmp_path / "features"
    blocked.write_text("a file where the cache's folder would be")  # refused whoever runs the test, root too
    cache, compute = FeatureCache(blocked), Counting(model)
    images, labels = images_of(2, 4)
    with caplog.at_level(logging.WARNING):
        out = cache.features(model, images, labels, CONTEXT, compute)
    assert caplog.text.count("Could not write the feature cache") == 1  # one warning, not one per class
    assert "unreadable" not in caplog.text  # nothing there is a miss, not damage
    torch.testing.assert_close(out, compute(images))


def test_a_frozen_learner_scores_the_same_from_cached_features(color_data, one_task_learner, tmp_path):
    out = tmp_path / "learner"
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), tasks=1)
    run = api.RunOptions(method="ranpac", width=0.125, pretrained=str(one_task_learner), device="cpu",
                         train=TrainConfig(epochs=1, batch_size=16), memory=0, method_options={"projection": 64})
    api.train(seq, run, out)
    step = api.add_task(out, color_data["task2_train"], color_data["task2_test"], device="cpu")
    learner = Learner.load(out)
    test = api.evaluate(out)
    assert test.metrics.overall == step.metrics.overall  # read back from the cache, as recorded
    from sbcli.run.evalsets import load_test_sets

    images = load_test_sets(learner)
    engine = Engine(learner.state.train_config, torch.device("cpu"), learner.norm, 0)
    cache = FeatureCache(tmp_path / "fresh")
    direct = evaluate_learner(learner, engine, images)  # the network's forward pass, no cache
    assert evaluate_learner(learner, engine, images, cache=cache) == direct  # computed and stored
    assert len(list(cache.directory.glob("*.safetensors"))) == 4  # one entry per class
    assert evaluate_learner(learner, engine, images, cache=cache) == direct  # read back


def test_the_steps_of_a_frozen_learner_fill_the_cache(color_data, one_task_learner, tmp_path, monkeypatch):
    monkeypatch.setenv("SBCLI_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "learner"
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), tasks=1)
    run = api.RunOptions(method="simplecil", width=0.125, pretrained=str(one_task_learner), device="cpu",
                         train=TrainConfig(epochs=1, batch_size=16), memory=0)
    api.train(seq, run, out)
    cached = tmp_path / "cache" / "features"
    assert len(list(cached.glob("*.safetensors"))) == 2  # step 1: its two classes' test images
    api.add_task(out, color_data["task2_train"], color_data["task2_test"], device="cpu")
    assert len(list(cached.glob("*.safetensors"))) == 4  # step 2 adds the two new classes'; the old ones are read
