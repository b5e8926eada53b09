"""A training step replayed as one CUDA graph.

A 32 px ResNet step is hundreds of small kernels (the teacher's forward, the student's forward and
backward, the loss, a fused optimiser step, the phase's hooks); launched one by one from Python, the
GPU waits for the host most of the time (docs/lab/performance.md, "On a GPU": busy a quarter of the
time at batch 256 on an H100). Captured once per phase and replayed, a step costs the host a copy
of the batch's indices and one launch.

What makes the capture valid is what the engine already guarantees: the images live on the device,
a batch is a gather by an index tensor (copied into a fixed buffer before each replay), the loss
and hooks never read the device from the host, augmentation draws from a device generator (made
part of the graph's random state), and the learning rate is a device tensor the schedule fills
before each step. The first steps of a phase run eagerly on a side stream (cuDNN autotuning, the
optimiser's momentum buffers); a batch of another size (the last partial batch with ``--keep-last``)
runs eagerly too. A step that cannot be captured (an operation that reads the device from the host)
leaves the phase eager, and the reason is recorded in its report.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

StepFn = Callable[[torch.Tensor, bool], torch.Tensor]  # (batch indices, grads to None) -> the step's loss

WARMUP_STEPS = 3  # eager steps before the capture (PyTorch's advice for whole-network capture)


def device_lr(opt: torch.optim.Optimizer, device: torch.device) -> None:
    """Hold every parameter group's learning rate in a device tensor, so that a replayed optimiser step
    reads the value the schedule set for it (a Python float would be frozen into the graph)."""
    for group in opt.param_groups:
        group["lr"] = torch.tensor(float(group["lr"]), device=device)


class GraphedStep:
    """Calls ``step`` eagerly for its first :data:`WARMUP_STEPS` calls, then captures it once (on a full
    batch of ``batch_size`` images) and replays it for every full batch; a partial batch runs eagerly.

    ``generator`` is the device generator the augmentation draws from; ``status`` says whether the
    phase ran as a graph ("on"), had not got to it ("eager: ..."), or why it could not ("off: ...").
    """

    def __init__(self, step: StepFn, device: torch.device, generator: torch.Generator | None, batch_size: int) -> None:
        self.step = step
        self.batch_size = batch_size  # only full batches are captured and replayed
        self.device = device
        self.generator = generator
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_idx: torch.Tensor | None = None
        self.static_loss: torch.Tensor | None = None
        self.failure: str | None = None
        self.side = torch.cuda.Stream(device)

    @property
    def status(self) -> str:
        if self.failure is not None:
            return f"off: {self.failure}"
        return "on" if self.graph is not None else f"eager: {self.calls} steps, fewer than the warm-up"

    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        """The step's loss for batch ``idx``; a replay's loss tensor is overwritten by the next replay."""
        self.calls += 1
        if self.failure is not None or len(idx) != self.batch_size:
            return self.step(idx, self.graph is None)
        if self.graph is None and self.calls <= WARMUP_STEPS:
            return self._on_side_stream(idx)
        if self.graph is None:
            return self._capture(idx)
        self.static_idx.copy_(idx)
        self.graph.replay()
        return self.static_loss

    def _on_side_stream(self, idx: torch.Tensor) -> torch.Tensor:
        current = torch.cuda.current_stream(self.device)
        self.side.wait_stream(current)
        with torch.cuda.stream(self.side):
            loss = self.step(idx, True)
        current.wait_stream(self.side)
        return loss

    def _capture(self, idx: torch.Tensor) -> torch.Tensor:
        """Capture the step on ``idx`` (which capturing does not compute), then replay it once for ``idx``."""
        graph = torch.cuda.CUDAGraph()
        if self.generator is not None:
            graph.register_generator_state(self.generator)
        static_idx = idx.clone()
        try:  # torch.cuda.graph waits for the device first (once a phase)
            with torch.cuda.graph(graph, stream=self.side, capture_error_mode="thread_local"):
                static_loss = self.step(static_idx, True)
        except RuntimeError as err:  # an operation that cannot be captured: the phase goes on eagerly
            self.failure = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            torch.cuda.synchronize(self.device)
            return self.step(idx, True)
        self.graph, self.static_idx, self.static_loss = graph, static_idx, static_loss
        graph.replay()
        return static_loss
