"""The declared choices of docs/method.md, each with its alternative selectable (no training here)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from sbcli.data.device import DeviceData
from sbcli.engine.loop import Phase, PhaseReport
from sbcli.errors import ConfigError
from sbcli.methods import TaskContext, build_config, dd, std
from sbcli.methods.rules import class_means
from sbcli.nets.head import clip_head_weights
from sbcli.methods.split_bridge import DEFAULT_GAMMA
from sbcli.metrics import StepMetrics
from sbcli.nets import create_model


class HookEngine:
    """Runs no epochs: scrambles the head as training might, applies the phase's hooks once, records the phase."""

    def __init__(self) -> None:
        self.phases: list[Phase] = []
        self.generator = torch.Generator().manual_seed(0)

    def run(self, model: torch.nn.Module, data: DeviceData, phase: Phase) -> PhaseReport:
        with torch.no_grad():
            model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=self.generator))
            model.head.bias.fill_(0.5)
        for hook in phase.after_step:
            hook(model)
        self.phases.append(phase)
        return PhaseReport(phase.name, phase.epochs, 0.0, 0.0, 0.0)


def context(engine: HookEngine) -> TaskContext:
    torch.manual_seed(0)
    model = create_model("resnet18", 4, width=0.125)
    data = DeviceData(torch.zeros(8, 3, 8, 8, dtype=torch.uint8), torch.tensor([0, 1, 2, 3] * 2))
    nan = float("nan")
    return TaskContext(step=1, model=model, teacher=create_model("resnet18", 2, width=0.125).eval(), data=data,
                       num_old=2, num_total=4, engine=engine, epochs=1,
                       evaluate=lambda: StepMetrics(nan, [nan, nan], nan, nan, nan, nan),
                       make_aux_model=lambda n: create_model("resnet18", n, width=0.125))


@pytest.mark.parametrize("method", ["std", "dd"])
@pytest.mark.parametrize("wa_clip", [False, True])
def test_wa_clips_the_head_in_every_step_only_when_asked(method, wa_clip):
    ctx = context(HookEngine())
    cfg = build_config(method, {"wa_clip": wa_clip})
    (std if method == "std" else dd).learn_task(ctx, cfg)
    head = ctx.model.head
    assert bool((head.weight >= 0).all()) is wa_clip  # WA scales rows by a positive factor: signs are kept
    assert float(head.bias.detach().abs().max()) == 0.0  # WA training holds the bias at zero either way


def test_wa_clip_goes_with_weight_aligning_only():
    with pytest.raises(ConfigError, match="--wa-clip"):
        build_config("std", {"inference": "none", "wa_clip": True})


@pytest.mark.parametrize("head_rules", [False, True])
def test_dd_temporary_network_gets_step_1_head_rules_only_when_asked(head_rules):
    engine = HookEngine()
    dd.learn_task(context(engine), build_config("dd", {"aux_head_rules": head_rules}))
    temporary = next(p for p in engine.phases if p.name == "dd-new")
    assert (clip_head_weights in temporary.after_step) is head_rules


def test_nme_class_means_with_and_without_flips():
    images = torch.arange(2 * 3 * 2 * 2, dtype=torch.uint8).view(2, 3, 2, 2)
    labels = torch.tensor([0, 0])

    def features(x: torch.Tensor) -> torch.Tensor:
        return x.float().flatten(1)[:, :4]  # not flip-invariant

    plain = class_means.class_means(features, images, labels, 1, flips=False)
    torch.testing.assert_close(plain[0], F.normalize(F.normalize(features(images), dim=1).mean(0), dim=0))
    flipped = class_means.class_means(features, images, labels, 1)
    both = F.normalize(features(images), dim=1) + F.normalize(features(images.flip(-1)), dim=1)
    torch.testing.assert_close(flipped[0], F.normalize(both.mean(0), dim=0))
    assert not torch.allclose(plain, flipped)
    assert build_config("std", {"inference": "icarl"}).nme_flips is True


def test_each_sparsity_form_gets_its_own_default_gamma_and_records_it():
    assert build_config("sb", {}).gamma == DEFAULT_GAMMA["code"] == 1.0
    assert build_config("sb", {"sparsity": "paper"}).gamma == DEFAULT_GAMMA["paper"]
    assert build_config("sb", {"sparsity": "paper", "gamma": 0.5}).gamma == 0.5
