"""Every CUDA path of the engine, run on the devices this machine has (``pytest -m gpu`` runs the CUDA ones).

Each test takes a ``device``: the CPU always, CUDA where there is a GPU. The CUDA cases carry the
``gpu`` mark and skip, saying why, on a machine without one; the CPU cases run in the ordinary
suite, so that the assertions themselves are exercised everywhere. What is checked: bf16 autocast
with channels-last, the device-resident uint8 data and its on-device augmentation, steps without
host synchronisation, each phase's step replayed as a CUDA graph (and the learning rate it reads), a bf16
Split-and-Bridge phase B keeping its cross weights exactly zero, the
teacher's forward, ``--compile``, float32 evaluation after bf16 training, a learner trained on the
device evaluated on the CPU, its ONNX export and ``sb predict --device``, and DDP over NCCL.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import warnings
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from typer.testing import CliRunner

from sbcli import api
from sbcli.cli.app import app
from sbcli.data.device import DeviceData, Normalization, augment, normalize
from sbcli.engine import distributed
from sbcli.engine.hardware import exact_float32
from sbcli.engine.loop import Engine, Phase, StepOutputs, TrainConfig
from sbcli.methods.losses import ce_loss, kd_ce_loss
from sbcli.methods.teachers import frozen_copy
from sbcli.nets.head import clip_head_weights, zero_head_bias
from sbcli.methods.split_bridge import separated_loss
from sbcli.nets import create_model
from sbcli.nets.partition import cross_mask, disconnect, enforce_masks, make_partition, sparsity_code

CUDA = torch.cuda.is_available()
NO_CUDA = "no CUDA GPU here (torch.cuda.is_available() is False); `pytest -m gpu` runs these where there is one"
GPU = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason=NO_CUDA)]
ON_EACH_DEVICE = pytest.mark.parametrize("device", [pytest.param("cpu", id="cpu"),
                                                    pytest.param("cuda", id="cuda", marks=GPU)])
SIZE, CLASSES, OLD = 16, 4, 2

pytestmark = pytest.mark.usefixtures("one_thread")


def uint8_data(count: int, device: str, seed: int = 0) -> DeviceData:
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (count, 3, SIZE, SIZE), dtype=torch.uint8, generator=gen)
    return DeviceData(images.to(device), (torch.arange(count) % CLASSES).to(device))


def small_net(device: str, classes: int = CLASSES, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return create_model("resnet18", classes, 0.125).to(device)


def old_teacher(device: str) -> torch.nn.Module:
    """A frozen model of the OLD classes: the teacher of an incremental step."""
    return frozen_copy(small_net(device, OLD, seed=1))


def engine_on(device: str, **train: object) -> Engine:
    cfg = TrainConfig(**{"epochs": 1, "batch_size": 8, "precision": "bf16", **train})
    return Engine(cfg, torch.device(device), Normalization(), seed=0)


def phase_c(teacher: torch.nn.Module, epochs: int = 1) -> Phase:
    return Phase("C", lambda o: kd_ce_loss(o.logits, o.targets, o.teacher_logits[:, :OLD], 0.5), epochs, teacher=teacher)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------------------------
# Training steps: bf16 autocast, channels-last, device-resident data, no host synchronisation
# ----------------------------------------------------------------------------------------------


@ON_EACH_DEVICE
def test_a_bf16_step_runs_channels_last_on_the_device_and_learns(device):
    model, data = small_net(device), uint8_data(32, device)
    seen: list[tuple[torch.dtype, bool, str]] = []
    model.conv1.register_forward_hook(lambda _m, i, out: seen.append(
        (out.dtype, i[0].is_contiguous(memory_format=torch.channels_last), out.device.type)))
    before = weights(model)
    report = engine_on(device).run(model, data, Phase("base", lambda o: ce_loss(o.logits, o.targets), 1))
    assert seen == [(torch.bfloat16, True, device)] * 4  # four steps of 8: bf16 convolutions on channels-last inputs
    assert report.precision == "bf16" and torch.isfinite(torch.tensor(report.final_loss))
    assert model.conv1.weight.dtype == torch.float32  # autocast: the weights stay float32
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    moved = [k for k, v in model.state_dict().items() if k.endswith("weight") and not torch.equal(v, before[k])]
    assert len(moved) > 10


@ON_EACH_DEVICE
def test_augmentation_runs_on_the_device_and_is_a_crop_and_flip_of_each_image(device):
    data, norm = uint8_data(24, device), Normalization()
    engine = engine_on(device)
    gen = engine.augment_generator
    assert gen.device.type == device  # CUDA: drawn on the GPU, no host copy per batch
    batches = list(data.batch_indices(8, engine.generator))
    assert all(b.device.type == device for b in batches)
    assert sorted(torch.cat(batches).tolist()) == list(range(24))
    x = augment(data.images, norm, gen, channels_last=True)
    assert x.device.type == device and x.dtype == torch.float32
    assert x.is_contiguous(memory_format=torch.channels_last)
    pad = SIZE // 8
    padded = torch.nn.functional.pad(data.images, (pad,) * 4)  # zero bytes, normalised like the image
    candidates = {(dy, dx, flip) for dy in range(2 * pad + 1) for dx in range(2 * pad + 1) for flip in (False, True)}
    used = set()
    for i in range(len(data)):
        match = None
        for dy, dx, flip in sorted(candidates):
            crop = padded[i : i + 1, :, dy : dy + SIZE, dx : dx + SIZE]
            crop = crop.flip(-1) if flip else crop
            if torch.allclose(normalize(crop, norm), x[i : i + 1], atol=1e-5):
                match = (dy, dx, flip)
                break
        assert match is not None, f"image {i} is not a padded crop (and flip) of its source"
        used.add(match)
    assert len(used) > 3  # offsets and flips are drawn per image


SYNC_PHASES = ("base", "A", "B", "C")


def sync_phase(name: str, model: torch.nn.Module, teacher: torch.nn.Module) -> Phase:
    """The phases of a run as the methods build them: the first task, S&B's A (sparsity), B (masks), C."""
    if name == "base":
        return Phase("base", lambda o: ce_loss(o.logits, o.targets), 1, after_step=(zero_head_bias, clip_head_weights))
    if name == "C":
        return phase_c(teacher)
    partition = make_partition(model, 1.0, OLD)
    if name == "A":
        return Phase("A", separated_loss(OLD, sparsity_code, 1.0, partition), 1, teacher, after_step=(zero_head_bias,))
    disconnect(model, partition)
    return Phase("B", separated_loss(OLD), 1, teacher, after_step=(enforce_masks,))


def count_syncs(engine: Engine, model: torch.nn.Module, data: DeviceData, phase: Phase) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            engine.run(model, data, phase)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message) for w in caught)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
@pytest.mark.parametrize("name", SYNC_PHASES)
def test_steps_do_not_synchronise_the_host(name):
    """The host waits for the GPU a fixed number of times per epoch, however many batches it has."""
    model, teacher = small_net("cuda"), old_teacher("cuda")
    engine = engine_on("cuda")
    phase = sync_phase(name, model, teacher)
    engine.run(model, uint8_data(16, "cuda"), phase)  # warm-up: cuDNN autotuning, allocator growth
    # both runs get past the eager warm-up steps to the step's CUDA graph (whose capture waits, once a phase)
    short = count_syncs(engine, model, uint8_data(64, "cuda"), phase)  # 8 batches
    long = count_syncs(engine, model, uint8_data(128, "cuda"), phase)  # 16 batches
    # one-off waits (a lazily built buffer) may fall in either run; a wait per batch would add 8 or more
    assert long <= short, f"{long - short} extra host synchronisations for 8 more batches in phase {name}"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
@pytest.mark.parametrize("name", SYNC_PHASES)
def test_each_phase_replays_its_step_as_one_cuda_graph_and_learns(name):
    model, teacher = small_net("cuda"), old_teacher("cuda")
    phase = sync_phase(name, model, teacher)
    before = weights(model)
    report = engine_on("cuda").run(model, uint8_data(64, "cuda"), phase)  # 3 eager steps, the capture, 4 replays
    assert report.extra["cuda_graph"] == "on"
    assert torch.isfinite(torch.tensor(report.final_loss))
    moved = [k for k, v in model.state_dict().items() if k.endswith("weight") and not torch.equal(v, before[k])]
    assert len(moved) > 10
    eager_model = small_net("cuda")
    off = engine_on("cuda", cuda_graphs=False).run(eager_model, uint8_data(64, "cuda"), sync_phase(name, eager_model, teacher))
    assert "cuda_graph" not in off.extra  # --no-cuda-graphs: every step eager


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_a_replayed_step_reads_the_learning_rate_the_schedule_sets():
    """lr 0.1 in the first epoch, then 1e-12 of it: the second epoch's replays must leave the weights be."""
    model = small_net("cuda")
    seen: list[dict[str, torch.Tensor]] = []
    cfg = TrainConfig(epochs=2, batch_size=8, precision="bf16", milestones=(0.5,), lr_decay=1e-12)
    engine = Engine(cfg, torch.device("cuda"), Normalization(), seed=0,
                    on_progress=lambda _event: seen.append({k: p.detach().clone() for k, p in model.named_parameters()}))
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    report = engine.run(model, uint8_data(64, "cuda"), Phase("base", lambda o: ce_loss(o.logits, o.targets), 2))
    assert report.extra["cuda_graph"] == "on"
    first, second = seen
    assert sum(not torch.equal(first[k], before[k]) for k in before) > 10  # epoch 1 trained (3 eager steps, 5 replays)
    for k in before:
        torch.testing.assert_close(second[k], first[k], rtol=0, atol=1e-6, msg=f"{k} moved at lr 1e-13")


# ----------------------------------------------------------------------------------------------
# Split-and-Bridge under bf16, the teacher, compile, evaluation
# ----------------------------------------------------------------------------------------------


@ON_EACH_DEVICE
@pytest.mark.parametrize("hooks", [(enforce_masks,), ()], ids=["with-enforce-masks", "mask-alone"])
def test_a_bf16_phase_b_keeps_every_masked_cross_weight_exactly_zero(device, hooks):
    model, teacher = small_net(device, CLASSES), old_teacher(device)
    partition = make_partition(model, 1.0, OLD)
    disconnect(model, partition)
    before = weights(model)
    engine = engine_on(device, weight_decay=5e-2)  # strong decay: any leak into the cross weights would show
    engine.run(model, uint8_data(32, device), Phase("B", separated_loss(OLD), 2, teacher, after_step=hooks))
    for layer in model.partitioned_layers():
        weight, mask = layer.module.weight.detach(), cross_mask(layer, partition)
        assert torch.count_nonzero(weight * mask) == 0, layer.name
        name = next(k for k, v in model.named_parameters() if v is layer.module.weight)
        assert not torch.equal(weight * (1 - mask), before[name] * (1 - mask)), layer.name  # the rest learned


@ON_EACH_DEVICE
def test_the_teacher_runs_frozen_without_gradient_and_gives_its_own_logits(device):
    model, teacher = small_net(device), old_teacher(device)
    teacher_before = weights(teacher)
    seen: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def loss(out: StepOutputs) -> torch.Tensor:
        seen.append((out.inputs.detach(), out.teacher_logits))
        return kd_ce_loss(out.logits, out.targets, out.teacher_logits[:, :OLD], 0.5)

    engine_on(device).run(model, uint8_data(16, device), Phase("C", loss, 1, teacher=teacher))
    assert not teacher.training and all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(v, teacher_before[k]) for k, v in teacher.state_dict().items())  # BN statistics too
    x, teacher_logits = seen[-1]
    assert teacher_logits is not None and not teacher_logits.requires_grad and teacher_logits.dtype == torch.float32
    with torch.no_grad(), exact_float32(torch.device(device)):
        reference = teacher(x).float()
    torch.testing.assert_close(teacher_logits, reference, rtol=5e-2, atol=5e-2)  # bf16 against float32


def compile_param(device: str) -> object:
    marks = list(GPU) if device == "cuda" else [pytest.mark.slow]  # CPU: inductor builds C++ (a minute)
    if device == "cpu" and shutil.which(os.environ.get("CXX", "g++")) is None:
        marks.append(pytest.mark.skip(reason="torch.compile on the CPU needs a C++ compiler (none found)"))
    return pytest.param(device, id=device, marks=marks)


@pytest.mark.parametrize("device", [compile_param("cpu"), compile_param("cuda")])
def test_a_compiled_phase_trains_with_its_teacher_and_follows_the_masks(device):
    """``--compile``: S&B's phase B (masked student, compiled teacher) trains and keeps the masks.

    One phase, so that the check compiles two graphs (student with backward, teacher) and no more.
    """
    model, teacher = small_net(device), old_teacher(device)
    partition = make_partition(model, 1.0, OLD)
    disconnect(model, partition)
    before = weights(model)
    engine = engine_on(device, compile=True)
    report = engine.run(model, uint8_data(32, device), Phase("B", separated_loss(OLD), 2, teacher))
    assert torch.isfinite(torch.tensor(report.final_loss))
    moved = [k for k, v in model.state_dict().items() if k.endswith("weight") and not torch.equal(v, before[k])]
    assert len(moved) > 10
    for layer in model.partitioned_layers():
        assert torch.count_nonzero(layer.module.weight.detach() * cross_mask(layer, partition)) == 0, layer.name
    images = uint8_data(8, device).images
    model.eval()
    with torch.no_grad(), exact_float32(torch.device(device)):
        plain = model(normalize(images, Normalization(), channels_last=True))
    torch.testing.assert_close(engine.logits(model, images), plain.cpu(), rtol=1e-4, atol=1e-4)


@ON_EACH_DEVICE
def test_evaluation_after_bf16_training_is_a_float32_forward(device):
    model, data = small_net(device), uint8_data(32, device)
    engine = engine_on(device)
    engine.run(model, data, phase_c(old_teacher(device)))
    logits = engine.logits(model, data.images)
    assert logits.dtype == torch.float32 and logits.device.type == "cpu"
    on_cpu = copy_to_cpu(model).eval()
    with torch.no_grad():
        reference = on_cpu(normalize(data.images.cpu(), Normalization()))
    # float32 on both sides; TF32 (cuDNN's default for float32) would be about 1e-3 off
    torch.testing.assert_close(logits, reference, rtol=1e-4, atol=1e-4)


def copy_to_cpu(model: torch.nn.Module) -> torch.nn.Module:
    clone = create_model("resnet18", model.num_classes, 0.125)
    clone.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    return clone


# ----------------------------------------------------------------------------------------------
# A learner trained on the device: evaluated on the CPU, exported to ONNX, sb predict --device
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(four_colors, tmp_path_factory, request) -> Path:
    """S&B on two tasks of the four colours, trained on the test's device (module-wide: once per device)."""
    device = request.param
    out = tmp_path_factory.mktemp(f"trained-{device}") / "learner"
    seq = api.SequenceOptions(source=str(four_colors["train"]), test=str(four_colors["test"]), image_size=SIZE, tasks=2)
    run = api.RunOptions(method="sb", width=0.125, train=TrainConfig(epochs=2, batch_size=16), memory=16, device=device)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        api.train(seq, run, out)
    finally:
        torch.set_num_threads(before)
    return out


ON_EACH_TRAINED = pytest.mark.parametrize("trained", [pytest.param("cpu", id="cpu"),
                                                      pytest.param("cuda", id="cuda", marks=GPU)], indirect=True)


@ON_EACH_TRAINED
def test_a_learner_trained_on_the_device_evaluates_on_the_cpu_with_the_same_accuracy(trained):
    state = json.loads((trained / "learner.json").read_text())
    on_cpu = api.evaluate(trained, device="cpu")
    assert on_cpu.steps == 2 and on_cpu.test_images == 32
    assert on_cpu.metrics.overall == state["history"][-1]["metrics"]["overall"]
    assert on_cpu.metrics.per_task == state["history"][-1]["metrics"]["per_task"]


@pytest.fixture(scope="module")
def exported(trained: Path) -> tuple[Path, object]:
    """The trained learner's ONNX file (written next to it) and the export's report."""
    path = trained.parent / "model.onnx"
    return path, api.export_onnx(trained, path)


@ON_EACH_TRAINED
def test_the_onnx_export_of_a_learner_trained_on_the_device_passes_its_parity_check(exported):
    path, report = exported
    assert path.is_file()
    assert report.parity.max_abs_diff <= 1e-4 * max(1.0, report.parity.score_scale)
    assert report.parity.argmax_agreement == 1.0


@ON_EACH_TRAINED
def test_sb_predict_on_the_device_answers_as_the_onnx_model(trained, exported, four_colors, request):
    device = request.node.callspec.params["trained"]
    images = str(four_colors["test"])
    runner = CliRunner()
    learner = runner.invoke(app, ["predict", str(trained), images, "--device", device, "--top-k", "4", "--json"])
    onnx = runner.invoke(app, ["predict", str(exported[0]), images, "--provider", "cpu", "--top-k", "4", "--json"])
    assert learner.exit_code == 0, learner.output
    assert onnx.exit_code == 0, onnx.output
    ours, theirs = json.loads(learner.stdout), json.loads(onnx.stdout)
    assert ours["provider"] == f"pytorch-{device}"  # the learner ran on the device asked for
    ours, theirs = ours["predictions"], theirs["predictions"]
    assert len(ours) == 32 and [p["top"][0]["label"] for p in ours] == [p["top"][0]["label"] for p in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert a["image"] == b["image"]
        assert {t["label"]: t["probability"] for t in a["top"]} == pytest.approx(
            {t["label"]: t["probability"] for t in b["top"]}, abs=1e-4)


# ----------------------------------------------------------------------------------------------
# DDP over NCCL
# ----------------------------------------------------------------------------------------------

GPUS = torch.cuda.device_count() if CUDA else 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nccl_worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    with distributed.session("cuda"):
        device = distributed.join(torch.device("cuda"))
        assert torch.distributed.get_backend() == "nccl" and device == torch.device("cuda", rank)
        model, teacher = small_net("cuda"), old_teacher("cuda")
        model, teacher = model.to(device), teacher.to(device)
        if rank == 1:  # DDP must start every rank from rank 0's weights
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.5)
        engine = Engine(TrainConfig(epochs=2, batch_size=16, precision="bf16"), device, Normalization(), seed=3)
        report = engine.run(model, uint8_data(64, str(device)), phase_c(teacher))
        logits = engine.logits(model, uint8_data(37, str(device)).images)
        torch.save({"state": {k: v.cpu() for k, v in model.state_dict().items()}, "logits": logits,
                    "loss": report.final_loss, "processes": report.processes}, Path(out_dir) / f"rank{rank}.pt")


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 2, reason=f"DDP over NCCL needs two GPUs, and this machine has {GPUS} "
                                     "(NCCL refuses two ranks on one GPU); tests/test_distributed.py covers DDP with gloo")
def test_two_gpus_train_one_model_over_nccl(tmp_path):
    mp.spawn(_nccl_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert all(torch.equal(ranks[0]["state"][k], ranks[1]["state"][k]) for k in ranks[0]["state"])
    assert torch.equal(ranks[0]["logits"], ranks[1]["logits"]) and ranks[0]["logits"].shape == (37, CLASSES)
    assert ranks[0]["loss"] == ranks[1]["loss"] and ranks[0]["processes"] == 2
