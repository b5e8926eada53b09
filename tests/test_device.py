"""Device rules: names resolved once, cuDNN autotuning confined to training."""

from __future__ import annotations

import pytest
import torch

from sbcli.engine.hardware import cudnn_autotune, resolve_device
from sbcli.errors import DeviceError


@pytest.mark.parametrize("before", [False, True])
def test_cudnn_autotune_is_restored_after_training(before: bool) -> None:
    saved = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = before
        with cudnn_autotune(torch.device("cuda")):
            assert torch.backends.cudnn.benchmark is True
        assert torch.backends.cudnn.benchmark is before
        with pytest.raises(RuntimeError), cudnn_autotune(torch.device("cuda")):
            raise RuntimeError("a phase that fails")
        assert torch.backends.cudnn.benchmark is before
        with cudnn_autotune(torch.device("cpu")):
            assert torch.backends.cudnn.benchmark is before  # nothing to tune on the CPU
    finally:
        torch.backends.cudnn.benchmark = saved


def test_unknown_device_is_refused() -> None:
    with pytest.raises(DeviceError, match="--device tpu is unknown"):
        resolve_device("tpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_the_python_face_keeps_resolve_device() -> None:
    from sbcli import api

    assert api.resolve_device is resolve_device


def test_free_threads_follow_the_cores_other_work_leaves():
    from sbcli.engine.hardware import free_threads

    assert free_threads(2, cores=2, running=1) == 2  # only this process runs: every core
    assert free_threads(2, cores=2, running=2) == 1  # another training's thread runs: one core left
    assert free_threads(2, cores=2, running=9) == 1  # never fewer than one
    assert free_threads(4, cores=8, running=1) == 4  # never more than asked for


def test_the_work_a_thread_count_makes_room_for_is_other_processes_not_this_ones_own_threads():
    import hashlib
    import threading

    from sbcli.engine import hardware

    if hardware.runnable_tasks() is None:
        pytest.skip("the system does not report its runnable tasks")
    stop, data = threading.Event(), bytes(1 << 22)

    def busy() -> None:  # hashing a large buffer releases the GIL: two threads of this process run at once
        while not stop.is_set():
            hashlib.sha256(data).digest()

    workers = [threading.Thread(target=busy) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        seen = 0
        for _ in range(2000):  # waits for the two to be seen running together, however slow the machine
            seen = max(seen, hardware.own_running_threads())
            if seen >= 2:
                break
        assert seen >= 2
    finally:
        stop.set()
        for w in workers:
            w.join()


def test_this_processs_own_running_threads_leave_the_cores_to_it(monkeypatch):
    from sbcli.engine import hardware

    monkeypatch.setattr(hardware, "machine_running_tasks", lambda: 3)
    monkeypatch.setattr(hardware, "own_running_threads", lambda: 3)  # the caller and its two decoding threads
    assert hardware.runnable_tasks() == 1 and hardware.free_threads(2, cores=2) == 2
    monkeypatch.setattr(hardware, "machine_running_tasks", lambda: 4)  # and one thread of another process
    assert hardware.runnable_tasks() == 2 and hardware.free_threads(2, cores=2) == 1


def test_default_compute_threads_restore_torch_setting(monkeypatch):
    import torch

    from sbcli.engine import hardware

    before = torch.get_num_threads()
    monkeypatch.setattr(hardware, "runnable_tasks", lambda: 10**6)
    with hardware.compute_threads(None):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
