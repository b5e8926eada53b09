"""--method ranpac: a ridge head on randomly projected frozen features. The head after T steps is the
joint ridge solution; the projection and backbone never change; ONNX parity; a backbone that is never
silently random; an sbcli learner as a backbone, recorded by name and hash, never by path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.engine.loop import TrainConfig
from sbcli.errors import ConfigError, LearnerError
from sbcli.learner.state import Learner
from sbcli.methods import ranpac

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()


def features(n: int, classes: int, dim: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=gen) * 3
    labels = torch.arange(n) % classes
    return (centres[labels] + torch.randn(n, dim, generator=gen)).relu(), labels


@pytest.mark.parametrize("projection", [0, 64])
def test_t_steps_give_the_joint_ridge_solution(projection):
    feats, labels = features(240, 6)
    cfg = ranpac.Config(projection=projection, ridge=10.0)
    state = ranpac.RidgeState.start(feats.shape[1], cfg, seed=3)
    for task in range(3):  # classes 0-1, 2-3, 4-5, each step seeing only its own images
        mask = (labels >= 2 * task) & (labels < 2 * task + 2)
        state, head, chosen = ranpac.fit_step(state, feats[mask], labels[mask], 2 * task + 2, cfg.ridge, seed=task)
        assert chosen["ridge"] == 10.0
    h = ranpac.project(feats, state.projection)
    joint = torch.linalg.solve(h.T @ h + 10.0 * torch.eye(h.shape[1], dtype=h.dtype), h.T @ ranpac.one_hot(labels, 6))
    torch.testing.assert_close(ranpac.solve_ridge(state.gram, state.targets, 10.0), joint, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(head.double() * chosen["temperature"], joint.T, rtol=1e-5, atol=1e-6)
    assert (h @ joint).argmax(1).eq(labels).float().mean() > 0.9


def test_the_ridge_is_chosen_on_held_back_images_and_the_temperature_sharpens():
    feats, labels = features(300, 5, seed=1)
    state = ranpac.RidgeState.start(feats.shape[1], ranpac.Config(projection=128), seed=0)
    _, head, chosen = ranpac.fit_step(state, feats, labels, 5, None, seed=0)
    assert chosen["ridge"] in ranpac.RIDGE_GRID and chosen["held_back"] == 60
    probs = (ranpac.project(feats, state.projection).float() @ head.T).softmax(1)
    assert float(probs.max(1).values.mean()) > 0.6  # not the near-uniform softmax of raw ridge scores (about 1/5)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_coarse_to_fine_search_finds_the_best_ridge_of_the_whole_grid(seed):
    feats, labels = features(300, 5, seed=seed)
    h, y = ranpac.project(feats, ranpac.random_projection(feats.shape[1], 96, seed)), ranpac.one_hot(labels, 5)
    fit, held = slice(0, 240), slice(240, 300)
    gram, targets = ranpac.accumulate(torch.zeros(96, 96, dtype=torch.float64), torch.zeros(96, 5, dtype=torch.float64),
                                      h[fit], y[fit])
    everywhere = [ranpac.held_back_error(gram, targets, h[held], y[held], r) for r in ranpac.RIDGE_GRID]
    assert ranpac.choose_ridge(gram, targets, h[held], y[held]) == ranpac.RIDGE_GRID[everywhere.index(min(everywhere))]


def test_g_is_kept_as_its_lower_triangle_and_grows_the_same_as_the_whole_matrix():
    """A step's file holds half of G; a learner saved with the whole of G (before it was packed) grows to the same bits."""
    torch.manual_seed(0)
    cfg = ranpac.Config(projection=64)
    first = ranpac.RidgeState.start(16, cfg, seed=0)
    first, _, _ = ranpac.fit_step(first, torch.randn(40, 16), torch.arange(40) % 2, 2, None, seed=1)
    packed = ranpac.pack_gram(first.gram)
    assert packed.shape == (64 * 65 // 2,) and torch.equal(ranpac.unpack_gram(packed, 64), first.gram)
    features, labels = torch.randn(30, 16), 2 + torch.arange(30) % 2
    grown = []
    for gram in (packed, first.gram):  # as saved now, as saved before
        extra = {ranpac.GRAM: gram, ranpac.TARGETS: first.targets, ranpac.PROJECTION_KEY: first.projection}
        state = ranpac.RidgeState.stored(extra, 2)
        grown.append(ranpac.fit_step(state, features, labels, 4, None, seed=2))
    (a, head_a, chosen_a), (b, head_b, chosen_b) = grown
    assert torch.equal(head_a, head_b) and torch.equal(a.gram, b.gram) and chosen_a.keys() == chosen_b.keys()
    assert all(torch.equal(v, chosen_b[k]) if isinstance(v, torch.Tensor) else v == chosen_b[k] for k, v in chosen_a.items())
    with pytest.raises(LearnerError, match="do not fit"):
        ranpac.RidgeState.stored({ranpac.GRAM: packed[:-1], ranpac.TARGETS: first.targets}, 2)


def test_a_bad_config_is_one_sentence():
    for kw, words in (({"projection": -1}, "--projection"), ({"ridge": 0.0}, "--ridge"),
                      ({"inference": "wa"}, "--inference wa")):
        with pytest.raises(ConfigError, match=words):
            ranpac.Config(**kw)


def run_options(pretrained: str | None, **kw) -> api.RunOptions:
    options = {"method": "ranpac", "width": 0.125, "pretrained": pretrained, "device": "cpu",
               "train": TrainConfig(epochs=1, batch_size=16), "memory": 0,
               "method_options": {"projection": 128}}
    return api.RunOptions(**{**options, **kw})


@pytest.fixture(scope="module")
def grown(color_data, one_task_learner, tmp_path_factory) -> Path:
    """Two tasks (red, green; blue, yellow) with --method ranpac on the backbone of an sbcli learner."""
    out = tmp_path_factory.mktemp("ranpac") / "learner"
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), tasks=1)
    api.train(seq, run_options(str(one_task_learner)), out)
    api.add_task(out, color_data["task2_train"], color_data["task2_test"], device="cpu")
    return out


def test_a_learner_as_backbone_brings_its_network_and_is_recorded_by_name(grown, one_task_learner):
    state, source = Learner.load(grown).state, Learner.load(one_task_learner).state
    assert (state.arch, state.width, state.normalization) == (source.arch, source.width, source.normalization)
    record = state.provenance.pretrained
    assert record["source"] == "learner" and record["name"] == one_task_learner.name and len(record["sha256"]) == 64
    assert str(one_task_learner.parent) not in (grown / "learner.json").read_text()  # no path of this machine


def test_add_task_trains_nothing_and_keeps_backbone_and_projection(grown, one_task_learner):
    learner = Learner.load(grown)
    backbone = {k: v for k, v in Learner.load(one_task_learner).model.state_dict().items() if not k.startswith("head.")}
    for key, value in backbone.items():
        assert torch.equal(learner.model.state_dict()[key], value), key
    history = learner.state.history
    assert all(h.phases == [] for h in history) and history[-1].network_metrics is None
    assert learner.extra[ranpac.PROJECTION_KEY].shape == (learner.model.num_features, 128)
    assert learner.extra[ranpac.GRAM].dtype == torch.float64 and learner.extra[ranpac.TARGETS].shape == (128, 4)
    assert learner.extra[ranpac.GRAM].shape == (128 * 129 // 2,)  # G's lower triangle
    assert history[-1].metrics.overall > 50  # 4 colours, chance 25 %


def test_the_onnx_export_is_the_ridge_head(grown, tmp_path):
    import onnx

    report = api.export_onnx(grown, tmp_path / "m.onnx")
    assert report.inference == "ridge" and report.parity.argmax_agreement == 1.0
    nodes = [n.op_type for n in onnx.load(str(tmp_path / "m.onnx")).graph.node]
    assert sum(op in ("MatMul", "Gemm") for op in nodes) == 2  # the projection and the ridge head, nothing else
    from sbcli.export.serving import open_learner
    from sbcli.serve.classifier import open_classifier

    images = torch.rand(3, 3, 32, 32).numpy()
    onnx_scores = open_classifier(tmp_path / "m.onnx").scores(images)
    torch_scores = open_classifier(grown, device="cpu", open_learner=open_learner).scores(images)
    assert abs(onnx_scores - torch_scores).max() < 1e-3 * max(1.0, abs(torch_scores).max())


def test_a_frozen_backbone_is_never_silently_random(color_data, tmp_path):
    args = ["train", str(color_data["task1_train"]), "--pretrained", "none", "--out", str(tmp_path / "x"), "--device", "cpu", "--width", "0.125"]
    for method in ("ranpac", "simplecil"):
        res = runner.invoke(app, [*args, "--method", method])
        assert res.exit_code == 1 and "random network" in res.stderr and "--pretrained random" in res.stderr, res.output
        assert not (tmp_path / "x").exists()
    res = runner.invoke(app, [*args, "--method", "ranpac", "--pretrained", "random", "--projection", "64", "--quiet"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "x" / "learner.json").read_text())["provenance"]["pretrained"] == {"source": "random"}


def test_a_learner_backbone_of_another_architecture_is_refused(one_task_learner, color_data, tmp_path):
    res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--out", str(tmp_path / "x"), "--device", "cpu",
                              "--method", "ranpac", "--pretrained", str(one_task_learner), "--width", "0.25"])
    assert res.exit_code == 1 and "drop --arch and --width" in res.stderr, res.output


def test_a_local_weights_file_is_recorded_by_name_and_hash(one_task_learner, color_data, tmp_path):
    from safetensors.torch import save_file

    model = Learner.load(one_task_learner).model
    weights = tmp_path / "deep" / "folder" / "backbone.safetensors"
    weights.parent.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    out = tmp_path / "x"
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), tasks=1, image_size=16)
    api.train(seq, run_options(str(weights)), out)
    record = Learner.load(out).state.provenance.pretrained
    assert record["name"] == "backbone.safetensors" and "path" not in record and len(record["sha256"]) == 64
    assert str(weights.parent) not in (out / "learner.json").read_text()
    shutil.rmtree(out)


def test_a_folder_with_a_pretrained_backbone_defaults_to_the_ridge_head(one_task_learner, color_data, tmp_path):
    out = tmp_path / "x"
    res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--out", str(out), "--device", "cpu",
                              "--pretrained", str(one_task_learner), "--projection", "64", "--quiet"])
    assert res.exit_code == 0, res.output
    state, source = Learner.load(out).state, Learner.load(one_task_learner).state
    assert state.method == "ranpac" and state.memory.budget == 0
    assert (state.arch, state.width, state.image_size) == (source.arch, source.width, source.image_size)
    res = runner.invoke(app, ["train", str(color_data["task1_train"]), "--out", str(tmp_path / "y"), "--device", "cpu",
                              "--pretrained", str(one_task_learner), "--method", "std", "--epochs", "1", "--quiet"])
    assert res.exit_code == 0 and Learner.load(tmp_path / "y").state.method == "std"  # an asked method stays


def test_resuming_with_other_weights_is_refused(one_task_learner, color_data, tmp_path):
    from safetensors.torch import save_file

    model = Learner.load(one_task_learner).model
    first, other = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(first))
    save_file({k: (v + 1 if v.is_floating_point() else v).contiguous() for k, v in model.state_dict().items()}, str(other))
    out = tmp_path / "x"
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), tasks=1, image_size=16)
    api.train(seq, run_options(str(first)), out)
    before = (out / "learner.json").read_bytes()
    with pytest.raises(Exception, match=r"grew from a.safetensors .* not from --pretrained"):
        api.train(seq, run_options(str(other)), out, resume=True)
    assert (out / "learner.json").read_bytes() == before
    api.train(seq, run_options(str(first)), out, resume=True)  # the same weights: resumed (nothing left to learn)
