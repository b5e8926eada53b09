"""The ridge and LDA heads' map of their tempered scores (sbcli.methods.rules.score_map): increasing (every
prediction is the head's own), fitted on the calibration bank where it holds enough images, the identity below,
kept by the learner and carried into the exported graph."""

from __future__ import annotations

import pytest
import torch
from test_ranpac import run_options

from sbcli import api
from sbcli.learner.state import Learner
from sbcli.methods.rules import score_map

pytestmark = pytest.mark.usefixtures("one_thread")


def _distorted(n: int, classes: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores whose softmax is miscalibrated in shape, not scale: a calibrated logit, cubed."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    logits = torch.randn(n, classes, generator=g, dtype=torch.float64)
    logits[torch.arange(n), labels] += 1.5
    return torch.sign(logits) * logits.abs() ** 3 / 4, labels


def test_below_the_bank_size_the_map_is_the_identity():
    scores, labels = _distorted(score_map.MIN_BANK - 1, 10)
    knots, coefficients = score_map.fit(scores, labels)
    assert len(knots) == 0 and torch.equal(score_map.apply_map(scores, knots, coefficients), scores)


def test_the_map_is_increasing_keeps_every_prediction_and_fits_the_bank_better():
    scores, labels = _distorted(2000, 20)
    knots, coefficients = score_map.fit(scores, labels)
    assert len(knots) == score_map.KNOTS
    grid = torch.linspace(float(scores.min()) - 1, float(scores.max()) + 1, 5000, dtype=torch.float64)
    assert bool((score_map.apply_map(grid, knots, coefficients).diff() > 0).all())  # strictly increasing
    assert bool((score_map.apply_map(grid.float(), knots, coefficients).diff() > 0).all())  # in float32 too
    slopes = coefficients.double().cumsum(0)
    assert bool(((slopes > 0.13) & (slopes < 7.4)).all())  # bounded: no slope that float32 cannot tell apart
    mapped = score_map.apply_map(scores, knots, coefficients)
    assert torch.equal(mapped.argmax(1), scores.argmax(1))
    nll = torch.nn.functional.cross_entropy
    assert float(nll(mapped, labels)) < float(nll(scores, labels)) - 0.05


def test_a_ridge_learner_keeps_its_map_scores_through_it_and_exports_it(monkeypatch, color_data, one_task_learner,
                                                                         tmp_path):
    fixed = (torch.tensor([0.5]), torch.tensor([2.0, -1.5]))  # slope 2, then 0.5: increasing
    monkeypatch.setattr(score_map, "fit", lambda scores, labels: fixed)  # the colour images need no map of their own
    out = tmp_path / "learner"
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), tasks=1)
    api.train(seq, run_options(str(one_task_learner)), out)
    api.add_task(out, color_data["task2_train"], color_data["task2_test"], device="cpu")
    learner = Learner.load(out, "cpu")
    assert torch.equal(learner.extra[score_map.KNOTS_KEY], fixed[0])
    assert torch.equal(learner.extra[score_map.COEFFICIENTS_KEY], fixed[1])
    assert all(r.record["score_map"] == 1 for r in learner.state.history)
    from sbcli.methods.rules.scoring_modules import ridge_module
    from sbcli.methods.rules.ridge import HEAD_KEY, PROJECTION_KEY

    features = torch.randn(5, learner.model.num_features)
    unmapped = {k: v for k, v in learner.extra.items() if not k.startswith("ranpac.score_")}
    with torch.no_grad():
        mapped_scores = ridge_module(learner.model, learner.extra, HEAD_KEY, PROJECTION_KEY).score_features(features)
        plain_scores = ridge_module(learner.model, unmapped, HEAD_KEY, PROJECTION_KEY).score_features(features)
    torch.testing.assert_close(mapped_scores, score_map.apply_map(plain_scores, *fixed))
    assert not torch.allclose(mapped_scores, plain_scores)
    report = api.export_onnx(out, tmp_path / "m.onnx")
    assert report.parity.argmax_agreement == 1.0 and report.parity.max_abs_diff < 1e-3
