"""The engine's precision: what ``auto`` picks, what a phase computes in and records, float32 evaluation."""

from __future__ import annotations

import pytest
import torch

from sbcli.data.device import DeviceData, Normalization, normalize
from sbcli.engine.hardware import native_bf16
from sbcli.engine.loop import Engine, Phase, TrainConfig, uses_bf16
from sbcli.methods.losses import kd_ce_loss
from sbcli.nets import create_model

CPU = torch.device("cpu")


@pytest.mark.parametrize(("avx512_bf16", "amx", "native"), [(False, False, False), (True, False, True),
                                                            (False, True, True)])
def test_auto_is_bf16_exactly_where_the_cpu_computes_bf16_natively(monkeypatch, avx512_bf16, amx, native):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert native_bf16(CPU) is native
    assert uses_bf16("auto", CPU) is native
    assert uses_bf16("bf16", CPU) is True and uses_bf16("fp32", CPU) is False


def test_unknown_precision_is_refused_before_any_work():
    with pytest.raises(Exception, match="precision fp16 is unknown"):
        TrainConfig(precision="fp16")


def _train_one_epoch(precision: str) -> tuple[list[torch.dtype], dict, Engine, torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    images = torch.randint(0, 256, (32, 3, 16, 16), dtype=torch.uint8)
    data = DeviceData(images, torch.arange(32) % 4)
    model, teacher = create_model("resnet18", 4, 0.125), create_model("resnet18", 4, 0.125)
    seen: list[torch.dtype] = []
    model.conv1.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    events = []
    engine = Engine(TrainConfig(epochs=1, batch_size=16, precision=precision), CPU, Normalization(), seed=0,
                    on_progress=events.append)
    phase = Phase("C", lambda o: kd_ce_loss(o.logits, o.targets, o.teacher_logits, 0.5), 1, teacher=teacher)
    report = engine.run(model, data, phase).to_json() | {"progress": [e.precision for e in events]}
    return seen, report, engine, model, images


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_a_phase_computes_in_its_precision_and_records_it(precision, dtype):
    seen, report, _, _, _ = _train_one_epoch(precision)
    assert seen == [dtype, dtype]  # two training steps of 16
    assert report["precision"] == precision and report["processes"] == 1
    assert report["progress"] == [precision]  # the progress line says it too


def test_evaluation_is_float32_after_bf16_training():
    _, _, engine, model, images = _train_one_epoch("bf16")
    logits = engine.logits(model, images)
    assert logits.dtype == torch.float32
    model.eval()
    with torch.no_grad():
        plain = model(normalize(images, Normalization(), channels_last=True))
    torch.testing.assert_close(logits, plain, rtol=1e-5, atol=1e-5)
