"""Memory flat in the number of images: a frozen backbone's add-task streams the new images in batches.

The streamed step learns what the decoded one learns (the same head, the same source record), never
holds more than two decoded batches, and a step that needs the whole decoded set in memory is refused
before any work when it would not fit, with its estimate.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from sbcli import api
from sbcli.data import sources, stream
from sbcli.data.fingerprint import RunningFingerprint, fingerprint
from sbcli.engine.loop import TrainConfig
from sbcli.errors import LearnerError
from sbcli.learner import preflight
from sbcli.learner.state import Learner
from sbcli.methods import ranpac, simplecil
from sbcli.methods.rules.prototype import PROTOTYPES_KEY, SCALE_KEY
from sbcli.run import add_task as add_task_module

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ridge_learner(color_data, one_task_learner, tmp_path_factory) -> Path:
    """One task (red, green) with --method ranpac on the backbone of an sbcli learner."""
    out = tmp_path_factory.mktemp("ridge") / "learner"
    run = api.RunOptions(method="ranpac", width=0.125, pretrained=str(one_task_learner), device="cpu",
                         train=TrainConfig(epochs=1, batch_size=16), memory=0, method_options={"projection": 128})
    api.train(api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), tasks=1),
              run, out)
    return out


@pytest.fixture(scope="module")
def prototype_learner(color_data, one_task_learner, tmp_path_factory) -> Path:
    """One task (red, green) with --method simplecil on the backbone of an sbcli learner."""
    out = tmp_path_factory.mktemp("prototypes") / "learner"
    run = api.RunOptions(method="simplecil", width=0.125, pretrained=str(one_task_learner), device="cpu",
                         train=TrainConfig(epochs=1, batch_size=16), memory=0)
    api.train(api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), tasks=1),
              run, out)
    return out


# what each frozen-backbone method that streams keeps of a step, compared streamed against decoded
KEPT = {"ridge_learner": (ranpac.GRAM, ranpac.TARGETS, "ranpac.head"),
        "prototype_learner": (PROTOTYPES_KEY, SCALE_KEY, simplecil.BANK, simplecil.COUNTS)}


def test_the_fingerprint_of_a_stream_is_the_decoded_sets(color_data):
    listed = stream.FolderStream.scan(color_data["task2_train"], 16)
    running = RunningFingerprint(listed.class_names, listed.labels)
    for _first, images in listed.batches(5):
        running.update(images)
    decoded = sources.load_folder(color_data["task2_train"], 16, cache=None).data
    assert running.result() == fingerprint(decoded)


@pytest.mark.parametrize("kind", list(KEPT))
def test_a_streamed_add_task_learns_what_a_decoded_one_learns_holding_two_batches_at_most(
        kind, request, color_data, tmp_path, monkeypatch):
    learner = request.getfixturevalue(kind)
    streamed, decoded = tmp_path / "streamed", tmp_path / "decoded"
    shutil.copytree(learner, streamed)
    shutil.copytree(learner, decoded)
    with monkeypatch.context() as m:
        m.setattr(add_task_module, "_streams", lambda learner, trains: False)
        api.add_task(decoded, color_data["task2_train"], color_data["task2_test"], device="cpu")
    rows: list[int] = []
    real_decode, real_load = stream.FolderStream._decode, sources.load_folder

    def counted(self, keys, each):
        rows.append(len(keys))
        return real_decode(self, keys, each)

    def never_the_train_folder(root, *args, **kwargs):
        assert Path(root) != Path(color_data["task2_train"]), "the training folder was decoded whole"
        return real_load(root, *args, **kwargs)

    monkeypatch.setattr(stream, "BATCH", 4)
    monkeypatch.setattr(stream.FolderStream.batches, "__defaults__", (4, None))
    monkeypatch.setattr(stream.FolderStream, "_decode", counted)
    monkeypatch.setattr(sources, "load_folder", never_the_train_folder)
    api.add_task(streamed, color_data["task2_train"], color_data["task2_test"], device="cpu")
    assert rows and max(rows) <= 4 and sum(rows) == len(stream.FolderStream.scan(color_data["task2_train"], 16))
    a, b = Learner.load(streamed), Learner.load(decoded)
    for key in KEPT[kind]:
        torch.testing.assert_close(a.extra[key], b.extra[key], rtol=1e-10, atol=1e-10)
    on_disk = [json.loads((p / "learner.json").read_text()) for p in (streamed, decoded)]
    assert on_disk[0]["tasks"] == on_disk[1]["tasks"]  # the same source record: fingerprints of the same pixels
    assert on_disk[0]["history"][1]["metrics"] == on_disk[1]["history"][1]["metrics"]


def test_simplecil_with_flips_decodes_the_new_images_whole_for_their_flipped_features(prototype_learner, color_data,
                                                                                     tmp_path, monkeypatch):
    learner = tmp_path / "flips"
    shutil.copytree(prototype_learner, learner)
    state = json.loads((learner / "learner.json").read_text())
    assert state["method"] == "simplecil" and not state["method_config"]["prototype_flips"]
    assert add_task_module._streams(Learner.load(learner), trains=False)
    flipping = Learner.load(learner)
    flipping.state.method_config = simplecil.Config(prototype_flips=True)
    assert not add_task_module._streams(flipping, trains=False)


def test_a_step_whose_decoded_images_would_not_fit_is_refused_before_any_work(one_task_learner, color_data,
                                                                              tmp_path, monkeypatch):
    learner = tmp_path / "std"
    shutil.copytree(one_task_learner, learner)
    before = {p: p.read_bytes() for p in learner.rglob("*") if p.is_file() and not p.name.startswith(".sbcli")}
    monkeypatch.setattr(preflight, "available_memory", lambda: 1000)
    monkeypatch.setattr(sources, "load_folder", lambda *a, **k: pytest.fail("decoded before the refusal"))
    with pytest.raises(LearnerError, match=r"new images decoded at 16 px would take about .* GiB of memory and this "
                                           r"machine has 0.0 GiB available; add the classes in smaller tasks"):
        api.add_task(learner, color_data["task2_train"], color_data["task2_test"], device="cpu",
                     options=api.AddTaskOptions(epochs=1))
    after = {p: p.read_bytes() for p in learner.rglob("*") if p.is_file() and not p.name.startswith(".sbcli")}
    assert after == before


def test_the_sums_added_in_chunks_equal_one_product_and_the_held_back_images_are_bounded(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    feats, labels = torch.randn(300, 24, generator=gen).relu(), torch.arange(300) % 3
    cfg = ranpac.Config(projection=64)
    start = ranpac.RidgeState.start(24, cfg, seed=0).grown(3)
    whole = ranpac.accumulate(start.gram, start.targets, ranpac.project(feats, start.projection),
                              ranpac.one_hot(labels, 3))
    monkeypatch.setattr(ranpac, "ROWS", 7)
    chunked = ranpac.accumulate_rows(start.gram, start.targets, feats, labels, 3, start.projection)
    for x, y in zip(whole, chunked, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-9)
    held = ranpac.held_back_split(labels, 0.2, seed=1, limit=30)
    assert int(held.sum()) == 30 and all(int(held[labels == c].sum()) == 10 for c in range(3))
    assert int(ranpac.held_back_split(labels, 0.2, seed=1).sum()) == 60
