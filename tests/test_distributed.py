"""Data-parallel training (DDP) on CPU with the gloo backend and two processes.

One test spawns two processes that run an engine phase together and compares what each rank ends
with; another runs ``torchrun --nproc-per-node 2 -m sbcli train`` and continues the learner it
wrote with ``add-task`` in this (single) process.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from torch import distributed as dist
from torch import nn

from sbcli import api
from sbcli.data.device import DeviceData, Normalization
from sbcli.engine import distributed
from sbcli.engine.distributed import DistInfo
from sbcli.engine.loop import Engine, Phase, TrainConfig
from sbcli.learner.state import FORMAT_VERSION, Learner
from sbcli.learner.store.layout import LOCK_FILE, LOCK_INFO
from sbcli.methods.losses import kd_ce_loss
from sbcli.nets import create_model

WORLD = 2
IMAGES, BATCH, CLASSES = 64, 16, 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------
# Sharding, in one process
# ----------------------------------------------------------------------------------------------


def test_shards_of_a_batch_are_disjoint_and_cover_it():
    batch = torch.randperm(23)
    shards = [distributed.shard(batch, DistInfo(r, 3)) for r in range(3)]
    assert sorted(torch.cat(shards).tolist()) == sorted(batch.tolist())
    assert [len(s) for s in shards] == [8, 8, 7]
    assert torch.equal(distributed.shard(batch, DistInfo()), batch)  # one process: the whole batch


def test_shard_ranges_tile_the_items_in_rank_order():
    ranges = [distributed.shard_range(10, DistInfo(r, 4)) for r in range(4)]
    assert ranges == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert distributed.shard_range(1, DistInfo(1, 2)) == (1, 1)  # a rank may get nothing


def test_without_torchrun_everything_is_one_process(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert distributed.info() == DistInfo()
    assert distributed.is_main_process()
    assert distributed.join(torch.device("cpu")) == torch.device("cpu")
    x = torch.arange(6.0).view(3, 2)
    assert distributed.gather_rows(x, 3, DistInfo()) is x
    assert distributed.broadcast_objects([1, "a"], DistInfo()) == [1, "a"]


# ----------------------------------------------------------------------------------------------
# An engine phase on two ranks
# ----------------------------------------------------------------------------------------------


def _phase_loss(out):
    return kd_ce_loss(out.logits, out.targets, out.teacher_logits[:, : CLASSES // 2], 0.5)


def _engine_worker(rank: int, port: int, out_dir: str) -> None:
    """One rank: a phase of two epochs with a teacher, then logits of 37 images (uneven shards)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    with distributed.session("cpu"):
        device = distributed.join(torch.device("cpu"))
        torch.manual_seed(0)
        model = create_model("resnet32", CLASSES, 0.25)
        teacher = create_model("resnet32", CLASSES, 0.25).eval()
        initial = {f"initial.{k}": v.clone() for k, v in model.state_dict().items()}
        if rank == 1:  # DDP must start every rank from rank 0's weights
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.5)
        gen = torch.Generator().manual_seed(1)
        images = torch.randint(0, 256, (IMAGES, 3, 16, 16), dtype=torch.uint8, generator=gen)
        labels = torch.randint(0, CLASSES, (IMAGES,), generator=gen)
        used: list[torch.Tensor] = []
        shard = distributed.shard

        def recording_shard(idx: torch.Tensor, group: DistInfo) -> torch.Tensor:
            used.append(shard(idx, group))
            return used[-1]

        distributed.shard = recording_shard  # this process only: record the indices this rank trained on
        events: list = []
        engine = Engine(TrainConfig(epochs=2, batch_size=BATCH, lr=0.05), device, Normalization(), seed=3,
                        on_progress=events.append)
        report = engine.run(model, DeviceData(images, labels), Phase("C", _phase_loss, 2, teacher=teacher))
        logits = engine.logits(model, images[:37])
        with torch.no_grad():
            model.eval()
            local = model(((images[:37].float() / 255 - torch.tensor(Normalization().mean).view(1, 3, 1, 1))
                           / torch.tensor(Normalization().std).view(1, 3, 1, 1)))
        tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file({**tensors, **initial, "gathered_logits": logits, "local_logits": local.contiguous(),
                   "used": torch.stack(used)}, str(Path(out_dir) / f"rank{rank}.safetensors"))
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({"events": len(events), "loss": report.final_loss}))


def test_two_ranks_train_one_model(tmp_path):
    mp.spawn(_engine_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(WORLD)]
    info = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    weights = [k for k in ranks[0] if not k.startswith(("initial.", "gathered_", "local_", "used"))]
    assert weights and all(torch.equal(ranks[0][k], ranks[1][k]) for k in weights), "ranks disagree after the phase"
    moved = [k for k in weights if k.endswith("weight") and not torch.equal(ranks[0][k], ranks[0]["initial." + k])]
    assert moved, "training did not change the weights"
    # each step's batch was split into disjoint halves that together cover every image of the epoch
    used = [r["used"] for r in ranks]
    assert used[0].shape == used[1].shape == (2 * IMAGES // BATCH, BATCH // WORLD)
    for epoch in range(2):
        steps = slice(epoch * IMAGES // BATCH, (epoch + 1) * IMAGES // BATCH)
        epoch_idx = torch.cat([used[0][steps].flatten(), used[1][steps].flatten()])
        assert sorted(epoch_idx.tolist()) == list(range(IMAGES))
    # evaluation: sharded, gathered in order, the same on both ranks and equal to a plain forward
    assert torch.equal(ranks[0]["gathered_logits"], ranks[1]["gathered_logits"])
    torch.testing.assert_close(ranks[0]["gathered_logits"], ranks[0]["local_logits"], rtol=1e-4, atol=1e-4)
    assert info[0]["events"] == 2 and info[1]["events"] == 0  # progress from rank 0 only
    assert info[0]["loss"] == info[1]["loss"]  # the epoch loss is reduced over ranks


def _teardown_worker(rank: int, port: int, out_dir: str) -> None:
    """One rank: a DDP step inside a session, with the cyclic garbage collector off, then what is left."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    gc.disable()  # as when no collection happens to run before the interpreter exits
    with distributed.session("cpu"):
        model = distributed.data_parallel(nn.Linear(4, 2), torch.device("cpu"), distributed.info())
        model(torch.randn(3, 4)).sum().backward()
        del model
    alive = sum(isinstance(o, nn.parallel.DistributedDataParallel) for o in gc.get_objects())
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({"ddp_alive": alive, "group": dist.is_initialized()}))


def test_a_session_releases_the_process_group_before_the_interpreter_exits(tmp_path):
    """DDP wrappers sit in reference cycles and hold the gloo process group: freed only at interpreter exit, they
    tore it down during finalization and aborted the process ("terminate called without an active exception")."""
    mp.spawn(_teardown_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    for r in range(WORLD):
        assert json.loads((tmp_path / f"rank{r}.json").read_text()) == {"ddp_alive": 0, "group": False}


# ----------------------------------------------------------------------------------------------
# torchrun -m sbcli train, then add-task in one process
# ----------------------------------------------------------------------------------------------


def test_only_the_writing_rank_checks_the_output_folder(color_data, monkeypatch, tmp_path):
    """Under torchrun rank 0 creates --out and its lock note; a rank that checked --out while the note was
    being written saw a non-empty folder and refused ("already exists and is not empty"), failing the job."""
    out = tmp_path / "learner"
    out.mkdir()
    (out / LOCK_FILE).write_text("")
    (out / f"{LOCK_INFO}.4242").write_text("{}")  # rank 0 writing its lock note (then renamed into place)
    monkeypatch.setattr(distributed, "is_main_process", lambda: False)
    monkeypatch.setattr("sbcli.run.sequence._train", lambda *args, **kwargs: "trained")
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), image_size=16)
    run = api.RunOptions(method="std", width=0.125, train=TrainConfig(epochs=1, batch_size=16), memory=8, device="cpu")
    assert api.train(seq, run, out) == "trained"


def test_torchrun_train_writes_a_learner_that_continues_in_one_process(color_data, tmp_path):
    out = tmp_path / "learner"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
           "-m", "sbcli", "train", str(color_data["task1_train"]), "--test", str(color_data["task1_test"]),
           "--out", str(out), "--method", "sb", "--tasks", "2", "--epochs", "1", "--width", "0.125",
           "--batch-size", "16", "--memory", "8", "--image-size", "16", "--device", "cpu", "--balance-epochs", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=170, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("step 2 done") == 1, done.stderr[-3000:]  # rank 0 alone prints
    assert done.stdout.count("Summary") == 1
    names = {p.name for p in out.iterdir()}
    assert "history.csv" in names and sorted(names - {"history.csv", "accuracy.png"}) == [".sbcli.lock", "learner.json", "steps"]  # rank 0's results
    learner = Learner.load(out)
    assert learner.state.format_version == FORMAT_VERSION and learner.state.steps == 2
    assert [p["name"] for p in learner.state.history[1].phases] == ["A", "B", "C", "balance"]  # balancing, under DDP
    assert len(learner.memory) == 8
    step = api.add_task(out, color_data["task2_train"], color_data["task2_test"], device="cpu",
                        options=api.AddTaskOptions(epochs=1))
    assert step.step == 3 and step.num_classes == 4
    again = Learner.load(out)
    assert again.state.steps == 3 and again.state.class_names[-2:] == ["blue", "yellow"]


def test_torchrun_add_task_trains_data_parallel_and_rank_0_alone_writes_and_prints(color_data, tmp_path):
    out = tmp_path / "learner"
    seq = api.SequenceOptions(source=str(color_data["task1_train"]), test=str(color_data["task1_test"]), image_size=16)
    run = api.RunOptions(method="std", width=0.125, train=TrainConfig(epochs=1, batch_size=16), memory=8, device="cpu")
    api.train(seq, run, out)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
           "-m", "sbcli", "add-task", str(out), str(color_data["task2_train"]), "--test", str(color_data["task2_test"]),
           "--epochs", "1", "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=170, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("Adding the images of") == 1, done.stderr[-3000:]  # rank 0 alone prints
    assert done.stderr.count("step 2 done") == 1, done.stderr[-3000:]
    learner = Learner.load(out)
    assert learner.state.steps == 2 and learner.state.class_names[2:] == ["blue", "yellow"]
    assert len(learner.memory) == 8 and sorted(learner.memory.labels.unique().tolist()) == [0, 1, 2, 3]
    assert [p["processes"] for p in learner.state.history[1].phases] == [WORLD]
    assert [p["processes"] for p in learner.state.history[0].phases] == [1]


def test_a_torchrun_process_ends_with_its_code_and_its_output_flushed(monkeypatch, capsys):
    """Under torchrun the `sb` process ends right after the command (no finalization, where a
    communication thread can abort it); alone, nothing changes."""
    from sbcli.cli import app as app_module

    ended = []
    monkeypatch.setattr(os, "_exit", ended.append)
    monkeypatch.setenv("WORLD_SIZE", "1")
    app_module.leave_torchrun_process(0)
    assert ended == []
    monkeypatch.setenv("WORLD_SIZE", "2")
    for code, expected in ((None, 0), (0, 0), (3, 3), ("Error: one sentence.", 1)):
        app_module.leave_torchrun_process(code)
        assert ended[-1] == expected
    assert "Error: one sentence." in capsys.readouterr().err
