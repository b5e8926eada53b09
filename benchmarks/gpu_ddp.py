"""DDP over NCCL on a GPU machine: ``torchrun --nproc-per-node N -m sbcli train``, then one process goes on.

N is the number of GPUs there (N = 1 still builds a real NCCL process group and wraps the model in
DistributedDataParallel). The run trains two tasks of two classes from the 32 px Tiny-ImageNet-100
archive (100 training images a class, one epoch a phase); it passes when torchrun exits 0, rank 0
alone printed, the learner has both steps with N processes recorded in every phase of step 2, and
``sb add-task`` of a third task in one ordinary process grows the same learner to three steps.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

Runner = Callable[[list[str], float], tuple[int, str, float]]  # (cmd, timeout) -> (exit code, output, seconds)


def task_folders(train: Path, test: Path, dest: Path, sizes: tuple[int, ...] = (4, 2), images: int = 100) -> list:
    """(train, test) class-per-folder pairs holding ``sizes[i]`` classes each, copied from the archive's folders."""
    classes = sorted(p.name for p in train.iterdir() if p.is_dir())[: sum(sizes)]
    if len(classes) < sum(sizes):
        raise ValueError(f"{train} holds {len(classes)} classes; the DDP check needs {sum(sizes)}")
    pairs, start = [], 0
    for i, size in enumerate(sizes):
        pair = (dest / f"part{i + 1}" / "train", dest / f"part{i + 1}" / "test")
        for name in classes[start : start + size]:
            for src, dst, cap in ((train, pair[0], images), (test, pair[1], None)):
                (dst / name).mkdir(parents=True, exist_ok=True)
                for f in sorted((src / name).iterdir())[:cap]:
                    shutil.copyfile(f, dst / name / f.name)
        pairs.append(pair)
        start += size
    return pairs


def ddp_check(run: Runner, work: Path, train: Path, test: Path, nproc: int, device: str, timeout: float) -> dict:
    """The torchrun training, the one-process add-task and what the learner recorded; ``passed`` says it all."""
    (t1, t1_test), (t3, t3_test) = task_folders(train, test, work / "ddp-data")  # 2 tasks of 2, then 2 more
    out = work / "ddp-learner"
    shutil.rmtree(out, ignore_errors=True)
    small = ["--pretrained", "none", "--epochs", "1", "--batch-size", "64", "--width", "0.25", "--memory", "40", "--device", device]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "sbcli",
           "train", str(t1), "--test", str(t1_test), "--tasks", "2", "--out", str(out), *small]
    code, output, seconds = run(cmd, timeout / 2)
    result: dict = {"nproc": nproc, "device": device, "torchrun_exit": code, "torchrun_s": round(seconds, 1),
                    "rank0_alone_printed": output.count("step 2 done") == 1}
    if code != 0:
        return result | {"passed": False, "tail": output[-2000:]}
    state = json.loads((out / "learner.json").read_text())
    result["processes_step2"] = [p.get("processes") for p in state["history"][1]["phases"]]
    code, output, seconds = run([sys.executable, "-m", "sbcli", "add-task", str(out), str(t3), "--test", str(t3_test),
                                 "--epochs", "1", "--device", device], timeout / 2)
    result |= {"add_task_exit": code, "add_task_s": round(seconds, 1)}
    steps = len(json.loads((out / "learner.json").read_text())["history"]) if code == 0 else None
    result["steps_after_add_task"] = steps
    result["passed"] = (result["rank0_alone_printed"] and steps == 3
                        and all(p == nproc for p in result["processes_step2"]))
    return result if code == 0 else result | {"passed": False, "tail": output[-2000:]}
