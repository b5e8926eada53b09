"""The speed benchmark's untimed parts: the paper's schedule and the reference loop's correctness."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sbcli.data.device import Normalization, normalize
from sbcli.nets import create_model

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_speed.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("engine_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["engine_speed"] = module  # dataclasses look their module up while the script loads
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("engine_speed", None)


def test_paper_schedules_count_the_spec_epochs(bench):
    # 10 tasks, rho 1.15: steps 2-7 split (3 x 200 epochs), 8-10 have bf = 1 (200): 4,400 epochs
    ten = bench.paper_schedule(10, 1.15)
    assert [s.phases for s in ten] == [1, 3, 3, 3, 3, 3, 3, 1, 1, 1]
    assert sum(s.phases * s.epochs for s in ten) == 4400
    assert ten[0].images == 5000 and all(s.images == 7000 for s in ten[1:])
    assert sum(s.phases * s.epochs for s in bench.paper_schedule(2, 1.0)) == 800
    twenty = bench.paper_schedule(20, 1.0)  # rho 1: bf = t / (t + 1) < 1, every later step splits
    assert all(s.phases == 3 for s in twenty[1:])
    assert twenty[1].images == 2500 + 2000  # 2,500 new images plus the 2,000 exemplars


def test_projected_hours_follow_the_rate(bench):
    rows = bench.schedule_rows({"fast": 2000.0, "slow": 1000.0})
    ten = next(r for r in rows if r["tasks"] == 10)
    assert ten["image_epochs"] == 200 * 5000 + 6 * 600 * 7000 + 3 * 200 * 7000
    assert ten["hours"]["fast"] == pytest.approx(ten["image_epochs"] / 2000 / 3600)
    assert ten["hours"]["slow"] == pytest.approx(2 * ten["hours"]["fast"])


def test_reference_transform_feeds_the_same_pixels_as_the_engine(bench):
    norm = Normalization()
    image = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
    pil = Image.fromarray(image.permute(1, 2, 0).numpy())
    plain = bench.reference_transform(32, norm, augment=False)(pil)
    torch.testing.assert_close(plain, normalize(image[None], norm)[0], rtol=0, atol=1e-5)
    augmented = bench.reference_transform(32, norm)(pil)
    assert augmented.shape == (3, 32, 32)
    # a 4-pixel zero-padded crop: every output row either matches a source row shifted (and maybe
    # flipped) or is padding, so the pixel values all come from the image or from zero padding
    zero = normalize(torch.zeros(1, 3, 1, 1, dtype=torch.uint8), norm).flatten()
    values = set(plain.flatten().round(decimals=4).tolist()) | set(zero.round(decimals=4).tolist())
    assert set(augmented.flatten().round(decimals=4).tolist()) <= values


def test_reference_loader_and_step_train(bench):
    torch.manual_seed(0)
    cfg = bench.BenchConfig(width=0.125, batch_size=16, classes=4, image_size=16, images=32, workers=0)
    images, labels = bench.random_images(32, 16, 4, seed=0)
    loader = bench.reference_loader(cfg, torch.device("cpu"), images, labels)
    x, y = next(iter(loader))
    assert x.shape == (16, 3, 16, 16) and x.dtype == torch.float32 and y.shape == (16,)
    model = create_model("resnet18", cfg.classes, cfg.width)
    teacher = copy.deepcopy(model).eval()
    opt = bench.reference_optimizer(model)
    losses = [bench.reference_step(model, teacher, opt, x, y, cfg.classes // 2) for _ in range(8)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
