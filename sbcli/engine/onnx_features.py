"""A frozen backbone's feature pass on onnxruntime: the same features as PyTorch's float32, about twice as fast.

A frozen-backbone method (``--method ranpac``, ``simplecil``) spends its step in one forward pass of the
backbone over every new image. On a CPU, onnxruntime ran that pass 1.9 times as fast as a bare PyTorch
float32 loop (ImageNet-style ResNet-18 x0.25 at 224 px, batch 64, 2 threads of an AVX-512 CPU: 760 against
396 images/s; ``sb add-task``'s whole pass, decoding included, 510 against 277; three times as fast on a
more loaded run: ``benchmarks/feature_pass_speed.py``, docs/lab/benchmarks.md), with features within 1e-6
of PyTorch's. bfloat16 autocast was as fast there, but 8e-3 off.

So the first frozen pass of a backbone exports ``forward_features`` to ONNX (uint8 NCHW images in, the
normalisation inside the graph, float32 features out, batch axis dynamic: normalising with PyTorch before
it cost a quarter of the pass) and keeps the file in sbcli's cache (``$SBCLI_CACHE/onnx-backbones``, else
``~/.cache/sbcli/decoded/onnx-backbones``), named by the SHA-256 of the backbone's tensors
(:func:`sbcli.engine.feature_cache.backbone_fingerprint`), the normalisation and the input size: a later
step, or another learner on the same backbone, loads it instead of exporting again. Before a pass uses
it, the ONNX features of the first :data:`CHECK_IMAGES` images are compared with PyTorch's float32: beyond
:data:`TOLERANCE` (the largest difference over the largest feature) the pass runs on PyTorch with a
one-line notice. PyTorch
also runs the pass on a GPU, across torchrun ranks (they shard and gather), where onnxruntime or the
exporter is not installed (a notice), and wherever ``SBCLI_FEATURE_ENGINE=torch``;
``SBCLI_FEATURE_ENGINE=onnxruntime`` makes each of those reasons an error instead.

Both runtimes give float32 features that differ in the last bits, so a learner built on one runtime and
rebuilt on the other can differ by about that much; one machine with one setting always takes one path.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sbcli.atomic import replacing
from sbcli.data.device import Normalization
from sbcli.data.sources import DecodeCache
from sbcli.engine.feature_cache import backbone_fingerprint
from sbcli.errors import ConfigError, TrainingError

logger = logging.getLogger(__name__)

ENV = "SBCLI_FEATURE_ENGINE"
CHOICES = ("auto", "torch", "onnxruntime")
FORMAT = 1  # bump when what is exported changes (opset, input, output), so that old files stop matching
FOLDER = "onnx-backbones"
OPSET = 17
TOLERANCE = 1e-4  # measured: 6e-7 on ResNet-18 x0.25 (largest difference over the largest feature)
CHECK_IMAGES = 8  # images of the first batch passed through both runtimes before the pass is trusted
# images a session run takes at most: onnxruntime keeps the largest activations it has needed (its arena), so the
# run's size is what its memory grows to (measured on a 2,000-image add-task at 224 px: 256 a run peaked 500 MB
# above PyTorch's pass, 64 as fast)
MAX_BATCH = 64

Features = Callable[[torch.Tensor], torch.Tensor]


def choice() -> str:
    """``$SBCLI_FEATURE_ENGINE`` (``auto`` when unset).

    Raises:
        ConfigError: a value other than ``auto``, ``torch`` or ``onnxruntime``.
    """
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ConfigError(f"{ENV}={value!r} is not a feature engine; set it to auto, torch or onnxruntime.")
    return value


@dataclass
class FeaturePass:
    """Pooled features (float32, CPU) of uint8 images under one frozen backbone, on onnxruntime.

    Attributes:
        session: the onnxruntime session of the backbone's export (uint8 images in).
        batch: images per session run.
    """

    session: Any
    batch: int = 64

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        out = []
        for start in range(0, len(images), self.batch):
            x = images[start:start + self.batch].cpu().contiguous().numpy()
            out.append(torch.from_numpy(self.session.run(None, {"images": x})[0]))
        return torch.cat(out).float() if out else torch.zeros(0)


def planned(device: torch.device, sharded: bool) -> str:
    """The runtime a frozen pass would take here (before any check): what a cache of its results is keyed by."""
    if choice() == "torch" or device.type != "cpu" or sharded:
        return "torch"
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return "torch"
    return "onnxruntime"


def prepare(model: nn.Module, images: torch.Tensor, torch_features: Features, *, device: torch.device,
            sharded: bool, norm: Normalization, threads: int, batch: int, cache: Path | None = None) -> FeaturePass | None:
    """The onnxruntime pass for ``model``'s backbone where it is installed, on a CPU, and agrees with
    ``torch_features`` on the first images of ``images`` (the first batch the pass will see); None: PyTorch.

    Raises:
        ConfigError: ``SBCLI_FEATURE_ENGINE`` is not a known value, or asks for onnxruntime where it cannot run.
        TrainingError: ``SBCLI_FEATURE_ENGINE=onnxruntime`` and the export disagrees with PyTorch.
    """
    wanted = choice()
    if wanted == "torch":
        return None
    if device.type != "cpu" or sharded:
        if wanted == "onnxruntime":
            raise ConfigError(f"{ENV}=onnxruntime runs the feature pass on one CPU process, not on "
                              f"{'several ranks' if sharded else device.type}; unset it there.")
        return None
    try:
        import onnxruntime as ort
    except ImportError:
        if wanted == "onnxruntime":
            raise ConfigError(f"{ENV}=onnxruntime needs onnxruntime; pip install 'sbcli[onnx]'.") from None
        logger.info("The feature pass runs on PyTorch: onnxruntime is not installed "
                    "(pip install 'sbcli[onnx]' makes it about three times as fast on a CPU).")
        return None
    size = int(images.shape[-1])
    path = (cache if cache is not None else DecodeCache.default().directory / FOLDER) / f"{export_key(model, norm, size)}.onnx"
    probe = images[:CHECK_IMAGES].cpu()
    reference = torch_features(probe).float().cpu()
    for fresh in (False, True):  # a cached file that fails is exported again, once
        cached = not fresh and path.is_file()
        if not fresh and not cached:
            continue
        try:
            data = path.read_bytes() if cached else _export_bytes(model, norm, size)
            candidate = FeaturePass(_session(ort, data, threads), min(batch, MAX_BATCH))
            difference = _difference(candidate(probe), reference)
        except Exception as err:  # noqa: BLE001  an export or a load fails in many ways; each one is told
            if cached:
                continue
            return _fallback(wanted, f"the backbone could not be run on onnxruntime ({type(err).__name__}: {err})")
        if difference <= TOLERANCE:
            if not cached:
                _store(path, data)
            logger.debug("The feature pass runs on onnxruntime (%s%s, %.1e from PyTorch float32).", path.name,
                         ", cached" if cached else "", difference)
            return candidate
        if not cached:
            return _fallback(wanted, f"its ONNX export's features are {difference:.1e} from PyTorch's float32 "
                                     f"(more than {TOLERANCE:.0e})")
    return None  # not reached: the fresh export returns on every path


def export_key(model: nn.Module, norm: Normalization, image_size: int) -> str:
    """The hex SHA-256 naming ``model``'s backbone export (its tensors, not its head) under ``norm`` at ``image_size``."""
    what = [FORMAT, OPSET, backbone_fingerprint(model), norm.to_json(), image_size, torch.__version__.split("+")[0]]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()


def _fallback(wanted: str, reason: str) -> None:
    if wanted == "onnxruntime":
        raise TrainingError(f"{ENV}=onnxruntime, but {reason}; unset it to run the pass on PyTorch.")
    logger.warning("The feature pass runs on PyTorch: %s.", reason)


class _Backbone(nn.Module):
    """uint8 images -> ``(x / 255 - mean) / std`` (as :func:`sbcli.data.device.normalize` computes it) -> features."""

    def __init__(self, model: nn.Module, norm: Normalization) -> None:
        super().__init__()
        self.model = model
        mean, std = torch.tensor(norm.mean, dtype=torch.float64), torch.tensor(norm.std, dtype=torch.float64)
        self.register_buffer("scale", (1.0 / (255.0 * std)).float().view(1, 3, 1, 1))
        self.register_buffer("shift", (-mean / std).float().view(1, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.forward_features(x.float() * self.scale + self.shift)


def _export_bytes(model: nn.Module, norm: Normalization, image_size: int) -> bytes:
    """``forward_features`` as ONNX, uint8 NCHW in (normalised by ``norm`` inside), [N, D] out, batch axis dynamic.

    The TorchScript exporter first: 0.13 s for a ResNet-18 x0.25 at 224 px where the torch.export-based one
    (what `sb export` uses, for its metadata and checks) took 4.2 s; the latter where the former fails or is gone.
    """
    was_training = model.training
    example = torch.zeros(2, 3, image_size, image_size, dtype=torch.uint8)
    wrapped = _Backbone(model, norm)
    try:
        model.eval()
        with torch.no_grad(), warnings.catch_warnings():
            # the TorchScript exporter's notice of its successor, and a tracer's doubts (a timm model's shape checks
            # become constants): what it made is checked against PyTorch's features before it is used
            warnings.simplefilter("ignore")
            try:
                buffer = io.BytesIO()
                torch.onnx.export(wrapped, (example,), buffer, input_names=["images"],
                                  output_names=["features"], dynamic_axes={"images": {0: "n"}, "features": {0: "n"}},
                                  opset_version=OPSET, dynamo=False)
                return buffer.getvalue()
            except Exception as err:  # noqa: BLE001  tried the other way below; its own error is the one told
                logger.debug("The TorchScript exporter failed (%s); trying torch.export.", err)
            program = torch.onnx.export(wrapped, (example,), None, dynamo=True, external_data=False,
                                        verbose=False, input_names=["images"], output_names=["features"],
                                        opset_version=OPSET, dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
            return program.model_proto.SerializeToString()
    finally:
        model.train(was_training)  # the exporter may leave the module in training mode


def _session(ort: Any, data: bytes, threads: int) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    # waiting threads sleep rather than spin, as torch's do (sbcli.engine.threads): the decoding of the next batch
    # shares the cores with this pass (measured: 421 against 375 images/s for the whole add-task pass)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # its own warnings are not the user's business; errors still raise
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _difference(got: torch.Tensor, reference: torch.Tensor) -> float:
    if got.shape != reference.shape or not torch.isfinite(got).all():
        return float("inf")
    return float((got - reference).abs().max() / reference.abs().max().clamp_min(1e-12))


def _store(path: Path, data: bytes) -> None:
    """Keep the export for the next pass; a cache that cannot be written costs only the next export (a warning)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as tmp:
            tmp.write_bytes(data)
    except OSError as err:
        logger.warning("Could not keep the backbone's ONNX export in %s (%s); it will be exported again next time.",
                       path.parent, err)
