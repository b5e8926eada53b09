"""The LDA head from the ridge head's sums (``--inference lda``), and the calibration of both frozen-backbone
heads on every class seen: the LDA after T steps is the one fitted on every image at once; the held-out
scores the temperature is fitted on are those of a head that never saw the image; ONNX parity."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sbcli import api
from sbcli.engine.loop import TrainConfig
from sbcli.learner.state import Learner
from sbcli.methods import ranpac, simplecil
from sbcli.methods.rules import RULES, lda

pytestmark = pytest.mark.usefixtures("one_thread")


def features(n: int, classes: int, dim: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=gen) * 3
    labels = torch.arange(n) % classes
    return (centres[labels] + torch.randn(n, dim, generator=gen)).relu(), labels


def grow(feats, labels, head: str, projection: int, tasks: int = 3):
    cfg = ranpac.Config(projection=projection)
    state = ranpac.RidgeState.start(feats.shape[1], cfg, seed=3)
    per = int(labels.max()) // tasks + 1
    for t in range(tasks):
        mask = (labels >= per * t) & (labels < per * (t + 1))
        state, head_w, chosen = ranpac.fit_step(state, feats[mask], labels[mask], per * (t + 1), None, seed=t,
                                                head=head)
    return state, head_w, chosen


@pytest.mark.parametrize("projection", [0, 64])
def test_the_lda_after_t_steps_is_the_lda_of_every_image_at_once(projection):
    feats, labels = features(300, 6)
    state, head_w, chosen = grow(feats, labels, "lda", projection)
    h = ranpac.project(feats, state.projection)
    means = torch.stack([h[labels == c].mean(0) for c in range(6)])
    centred = h - means[labels]
    cov = centred.T @ centred / (len(h) - 6)  # the pooled within-class covariance, from the images themselves
    a = chosen["shrinkage"]
    shrunk = (1 - a) * cov + a * torch.trace(cov) / cov.shape[0] * torch.eye(cov.shape[0], dtype=cov.dtype)
    w = torch.linalg.solve(shrunk, means.T)
    b = -0.5 * (means * w.T).sum(1)
    torch.testing.assert_close(state.counts, torch.bincount(labels).double())
    torch.testing.assert_close(head_w.double() * chosen["temperature"], w.T, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(chosen["bias"].double() * chosen["temperature"], b, rtol=1e-4, atol=1e-4)
    assert (h.float() @ head_w.T + chosen["bias"]).argmax(1).eq(labels).float().mean() > 0.9


def test_the_ridge_scores_the_temperature_is_fitted_on_are_exact_leave_one_out():
    feats, labels = features(120, 4, seed=1)
    h, y = ranpac.project(feats, None), ranpac.one_hot(labels, 4)
    gram, targets = h.T @ h, h.T @ y
    loo = ranpac.ridge_held_out_scores(h[:5], y[:5], gram, targets, 10.0)
    for i in range(5):
        keep = torch.arange(len(h)) != i
        refit = torch.linalg.solve(h[keep].T @ h[keep] + 10 * torch.eye(h.shape[1], dtype=h.dtype), h[keep].T @ y[keep])
        torch.testing.assert_close(loo[i], h[i] @ refit, rtol=1e-6, atol=1e-8)


def test_the_lda_held_out_scores_leave_the_image_out_of_its_class_mean():
    feats, labels = features(120, 4, seed=2)
    h = ranpac.project(feats, None)
    gram, targets, counts = h.T @ h, h.T @ ranpac.one_hot(labels, 4), torch.bincount(labels).double()
    scores = lda.held_out_scores(h[:4], labels[:4], gram, targets, counts, 0.1)
    means, cov = lda.covariance(gram, targets, counts)
    chol = lda.factor(cov, 0.1)
    for i in range(4):
        own = int(labels[i])
        others = (labels == own) & (torch.arange(len(h)) != i)
        mean = h[others].mean(0)
        solved = torch.cholesky_solve(mean[:, None], chol)[:, 0]
        torch.testing.assert_close(scores[i, own], h[i] @ solved - 0.5 * mean @ solved)


@pytest.mark.parametrize("head", ["ridge", "lda"])
def test_the_temperature_is_fitted_on_every_class_seen(head):
    feats, labels = features(600, 6, seed=3)
    state, _, chosen = grow(feats, labels, head, 64)
    assert chosen["calibrated_on"] == 6 * ranpac.BANK_PER_CLASS == len(state.bank_labels)
    assert sorted(state.bank_labels.unique().tolist()) == list(range(6))
    assert state.bank.shape == (6 * ranpac.BANK_PER_CLASS, feats.shape[1])


def test_simplecil_fits_its_scale_on_every_class_seen():
    from torch.nn import functional as F

    feats, labels = features(300, 6, seed=4)
    f = F.normalize(feats, dim=1)
    state = simplecil.PrototypeState.start()
    for t in range(3):
        mask = (labels >= 2 * t) & (labels < 2 * t + 2)
        state, scale = simplecil.fit_step(state, f[mask], f[mask], labels[mask], range(2 * t, 2 * t + 2), t)
    assert sorted(state.bank_labels.unique().tolist()) == list(range(6))
    torch.testing.assert_close(state.prototypes, simplecil.class_prototypes(f, labels, range(6)))
    torch.testing.assert_close(state.counts, torch.bincount(labels).double())
    assert scale > 1


def test_lda_is_offered_by_ranpac_alone():
    assert RULES.get("lda").scoring is not None
    assert ranpac.Config(inference="lda").inference == "lda"
    assert "lda" not in simplecil.Config.RULES
    from sbcli.errors import ConfigError

    with pytest.raises(ConfigError, match="drop --ridge"):
        ranpac.Config(inference="lda", ridge=10.0)


@pytest.fixture(scope="module")
def lda_learner(color_data, one_task_learner, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lda") / "learner"
    run = api.RunOptions(method="ranpac", width=0.125, pretrained=str(one_task_learner), device="cpu",
                         train=TrainConfig(epochs=1, batch_size=16), memory=0,
                         method_options={"projection": 128, "inference": "lda"})
    api.train(api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), tasks=1),
              run, out)
    api.add_task(out, color_data["task2_train"], color_data["task2_test"], device="cpu")
    return out


def test_an_lda_learner_grows_evaluates_and_exports_its_head(lda_learner, tmp_path):
    learner = Learner.load(lda_learner)
    assert learner.state.method_config.inference == "lda"
    assert learner.extra[lda.BIAS_KEY].shape == (4,) and learner.state.history[-1].metrics.overall > 50
    assert learner.state.history[-1].record["calibrated_on"] == 4 * min(ranpac.BANK_PER_CLASS, 24)
    report = api.export_onnx(lda_learner, tmp_path / "m.onnx")
    assert report.inference == "lda" and report.parity.argmax_agreement == 1.0


def test_a_learner_saved_before_the_bank_and_counts_still_grows_and_refuses_lda_in_one_sentence():
    from sbcli.errors import LearnerError

    feats, labels = features(200, 4, seed=5)
    first = labels < 2
    state, head_w, _ = ranpac.fit_step(ranpac.RidgeState.start(feats.shape[1], ranpac.Config(projection=32), 0),
                                       feats[first], labels[first], 2, None, seed=0)
    older = {k: v for k, v in state.tensors().items() if k in (ranpac.GRAM, ranpac.TARGETS, ranpac.PROJECTION_KEY)}
    stored = ranpac.RidgeState.stored(older, 2)
    assert stored.counts is None and stored.bank is None
    grown, _, chosen = ranpac.fit_step(stored, feats[~first], labels[~first], 4, None, seed=1)
    assert chosen["calibrated_on"] == 2 * ranpac.BANK_PER_CLASS  # the new classes' bank alone
    assert sorted(grown.bank_labels.unique().tolist()) == [2, 3]
    with pytest.raises(LearnerError, match="grow it with --inference ridge"):
        ranpac.fit_step(stored, feats[~first], labels[~first], 4, None, seed=1, head="lda")
    protos = simplecil.class_prototypes(feats[first], labels[first], range(2))
    old = simplecil.PrototypeState.stored({simplecil.PROTOTYPES_KEY: protos}, 2)
    from torch.nn import functional as F

    f = F.normalize(feats[~first], dim=1)
    grown_p, scale = simplecil.fit_step(old, f, f, labels[~first], range(2, 4), 1)
    assert grown_p.counts is None and grown_p.prototypes.shape[0] == 4 and scale >= 1


@pytest.mark.parametrize("head", ["ridge", "lda"])
def test_more_images_of_known_classes_are_one_more_exact_accumulation(head):
    """A step of new images of classes already learned (with one new class) gives the sums and counts of one
    fit on every image, and the head solved from them at the same strength (the library step; `sb add-task`
    does not yet take known class names)."""
    feats, labels = features(360, 6, seed=6)
    half = torch.arange(len(labels)) < 180
    first = half & (labels < 5)
    second = ~half & (labels != 4)  # more images of classes 0-3 and the first images of class 5
    cfg = ranpac.Config(projection=48)
    state = ranpac.RidgeState.start(feats.shape[1], cfg, seed=2)
    state, _, _ = ranpac.fit_step(state, feats[first], labels[first], 5, 10.0, seed=0, head=head)
    state, head_w, chosen = ranpac.fit_step(state, feats[second], labels[second], 6, 10.0, seed=1, head=head)
    both = first | second
    h = ranpac.project(feats[both], state.projection)
    torch.testing.assert_close(state.gram, h.T @ h, rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(state.targets, h.T @ ranpac.one_hot(labels[both], 6), rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(state.counts, torch.bincount(labels[both], minlength=6).double())
    assert int((state.bank_labels == 0).sum()) <= ranpac.BANK_PER_CLASS
    if head == "ridge":
        joint = torch.linalg.solve(h.T @ h + 10.0 * torch.eye(h.shape[1], dtype=h.dtype),
                                   h.T @ ranpac.one_hot(labels[both], 6))
        torch.testing.assert_close(head_w.double() * chosen["temperature"], joint.T, rtol=1e-5, atol=1e-6)
