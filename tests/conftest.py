"""Shared fixtures: a decode cache per test session, small synthetic class-per-folder data."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

# Fixtures kept beside this file by subject, registered as plugins (not imported by name into each test file)
pytest_plugins = ["conftest_hub", "conftest_runs", "conftest_data"]

# The colour of each synthetic class: distinct enough that a small network learns them in an epoch.
PALETTE = {"red": (200, 40, 40), "green": (40, 190, 60), "blue": (40, 60, 200), "yellow": (210, 200, 40),
           "purple": (150, 50, 170), "cyan": (40, 190, 200)}


@pytest.fixture(autouse=True, scope="session")
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep decoded datasets of the tests out of the user's cache."""
    os.environ["SBCLI_CACHE"] = str(tmp_path_factory.mktemp("decoded"))


def write_class_folder(root: Path, classes: list[str], per_class: int, size: int = 16, seed: int = 0) -> Path:
    """Noisy solid-colour images with a random bright square: one folder per class."""
    rng = np.random.default_rng(seed)
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            img = np.clip(np.array(PALETTE[name]) + rng.normal(0, 25, (size, size, 3)), 0, 255).astype(np.uint8)
            y, x = rng.integers(0, size - 4, 2)
            img[y : y + 4, x : x + 4] = 255
            Image.fromarray(img).save(root / name / f"{i:03d}.png")
    return root


@pytest.fixture(scope="session")
def color_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tasks of synthetic colour classes: task1 (red, green), task2 (blue, yellow), each train/test."""
    root = tmp_path_factory.mktemp("colors")
    out = {}
    for task, classes in (("task1", ["red", "green"]), ("task2", ["blue", "yellow"])):
        out[f"{task}_train"] = write_class_folder(root / task / "train", classes, 24, seed=1)
        out[f"{task}_test"] = write_class_folder(root / task / "test", classes, 8, seed=2)
    return out


@pytest.fixture(scope="session")
def four_colors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Four synthetic colour classes in one folder tree: 24 training and 8 test images each."""
    root = tmp_path_factory.mktemp("four-colors")
    classes = ["red", "green", "blue", "yellow"]
    return {"train": write_class_folder(root / "train", classes, 24, seed=1),
            "test": write_class_folder(root / "test", classes, 8, seed=2)}


@pytest.fixture
def one_thread():
    """One intra-op thread: on a busy 2-core machine two OpenMP threads run these nets 10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def sgd_lrs(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The learning rate of every SGD step taken from now on, in order (recorded inside ``SGD.step``)."""
    seen: list[float] = []
    real_step = torch.optim.SGD.step

    def step(self, *args, **kwargs):
        seen.append(self.param_groups[0]["lr"])
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.SGD, "step", step)
    return seen


@pytest.fixture(scope="session")
def one_task_learner(color_data, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved learner of one task (red, green; std, width 0.125, 1 epoch, memory 8): read it, never write it."""
    from sbcli import api
    from sbcli.engine.loop import TrainConfig

    out = tmp_path_factory.mktemp("learners") / "colors"
    run = api.RunOptions(method="std", width=0.125, train=TrainConfig(epochs=1, batch_size=16), memory=8, device="cpu")
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), image_size=16,
                              tasks=1)
    api.train(seq, run, out)
    return out


def interrupted_sequence(color_data: dict[str, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A folder of four colour classes and a learner `sb train --tasks 2` stopped after its first step (method
    finetune, width 0.125, 16 px): (data, learner)."""
    import shutil

    from sbcli import api
    from sbcli.engine.loop import TrainConfig

    data = tmp_path / "four"
    shutil.copytree(color_data["task1_train"], data)
    shutil.copytree(color_data["task2_train"], data, dirs_exist_ok=True)
    out = tmp_path / "seq"
    seq = api.SequenceOptions(source=str(data), image_size=16, tasks=2)
    run = api.RunOptions(method="finetune", width=0.125, train=TrainConfig(epochs=1, batch_size=16), memory=8, device="cpu")

    def interrupt(step: object) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        api.train(seq, run, out, on_step=interrupt)
    return data, out
