"""GPU options of the onnxruntime providers: CUDA graphs on the CUDA provider, fp16 and an engine
cache on the TensorRT provider.

* ``cuda_graph``: onnxruntime captures the model's kernels once per input shape and replays them,
  which removes most launch overhead at small batches. A captured graph reads and writes fixed
  device addresses, so the model runs through I/O binding on buffers that stay put
  (:class:`BoundRunner`): one buffer pair and one graph per batch bucket (powers of two up to the
  largest batch; a smaller batch is padded with zeros and its extra rows dropped).
* ``trt_fp16``: TensorRT may pick fp16 kernels (its engines are built on first use, then cached).
* ``trt_cache``: where TensorRT engines and its timing cache are kept, so a restart does not
  rebuild them (default: ``tensorrt`` in the serve cache).

On a machine without a GPU these options are refused before anything loads; :class:`BoundRunner`
itself also runs on the CPU (``device="cpu"``, no graph), which is how it is tested there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sbcli.errors import ConfigError
from sbcli.serve.cache import cache_dir

TRT, CUDA = "TensorrtExecutionProvider", "CUDAExecutionProvider"


@dataclass(frozen=True)
class GpuOptions:
    """The GPU options asked for (all off: the providers' defaults)."""

    cuda_graph: bool = False
    trt_fp16: bool = False
    trt_cache: str | None = None

    def check(self, provider: str) -> None:
        """Refuse options that the provider asked for would not use (one sentence)."""
        if self.cuda_graph and provider != "cuda":
            raise ConfigError("--cuda-graph runs on the CUDA provider; add --provider cuda.")
        if (self.trt_fp16 or self.trt_cache) and provider not in ("tensorrt", "auto"):
            raise ConfigError("--trt-fp16 and --trt-cache apply to the TensorRT provider; use --provider tensorrt or auto.")

    def cache_path(self) -> str:
        if self.trt_cache:
            return str(Path(self.trt_cache).expanduser())
        return str(cache_dir() / "tensorrt")

    def provider_options(self, providers: list[str]) -> list[dict[str, str]]:
        """onnxruntime's per-provider options, in the order of ``providers``."""
        out: list[dict[str, str]] = []
        for name in providers:
            if name == TRT:
                cache = self.cache_path()
                out.append({"trt_fp16_enable": str(self.trt_fp16), "trt_engine_cache_enable": "True",
                            "trt_engine_cache_path": cache, "trt_timing_cache_enable": "True",
                            "trt_timing_cache_path": cache})
            elif name == CUDA and self.cuda_graph:
                out.append({"enable_cuda_graph": "1"})
            else:
                out.append({})
        return out

    def describe(self, chosen: str) -> str:
        """The provider that runs the model, with the options it uses, e.g. ``tensorrt (fp16, engine cache /x)``."""
        notes = []
        if chosen == "cuda" and self.cuda_graph:
            notes.append("CUDA graphs")
        if chosen == "tensorrt":
            notes += ["fp16"] if self.trt_fp16 else []
            notes.append(f"engine cache {self.cache_path()}")
        return f"{chosen} ({', '.join(notes)})" if notes else chosen


def bucket(n: int, largest: int) -> int:
    """The batch size a batch of ``n`` runs at: the next power of two, or ``largest`` when that is smaller."""
    size = 1
    while size < n:
        size *= 2
    return max(n, min(size, largest))


@dataclass
class BoundRunner:
    """Runs a session through I/O binding on buffers that stay put, one set per batch bucket (see the module docstring)."""

    session: Any
    input_name: str
    output_name: str
    device: str = "cuda"
    graphs: bool = True
    largest: int = 64
    _bound: dict[int, tuple[Any, Any, Any, Any]] = field(default_factory=dict)

    def _slot(self, size: int, sample: np.ndarray, classes: int) -> tuple[Any, Any, Any, Any]:
        if size not in self._bound:
            import onnxruntime as ort

            x = ort.OrtValue.ortvalue_from_shape_and_type([size, *sample.shape[1:]], np.float32, self.device, 0)
            y = ort.OrtValue.ortvalue_from_shape_and_type([size, classes], np.float32, self.device, 0)
            binding = self.session.io_binding()
            binding.bind_ortvalue_input(self.input_name, x)
            binding.bind_ortvalue_output(self.output_name, y)
            options = ort.RunOptions()
            if self.graphs:
                options.add_run_config_entry("gpu_graph_id", str(len(self._bound) + 1))
            self._bound[size] = (x, y, binding, options)
        return self._bound[size]

    def scores(self, images: np.ndarray, classes: int) -> np.ndarray:
        n = len(images)
        size = bucket(n, max(self.largest, n))
        padded = images if size == n else np.concatenate([images, np.zeros((size - n, *images.shape[1:]), np.float32)])
        x, y, binding, options = self._slot(size, images, classes)
        x.update_inplace(np.ascontiguousarray(padded, dtype=np.float32))
        self.session.run_with_iobinding(binding, options)
        return y.numpy()[:n].copy()
