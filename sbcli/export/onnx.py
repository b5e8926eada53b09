"""ONNX export of a learner: one self-contained file that any ONNX runtime serves.

The graph: float32 RGB images in [0, 1], NCHW at the training resolution with a dynamic batch
axis (input ``images``) -> the learner's normalisation -> its scoring module from
:func:`sbcli.methods.inference.scoring_module` (the network with WA folded into the head, or a
registered rule such as BiC or nearest-mean with its tensors as constants) -> scores over every
class seen, in the learner's label order (output ``logits``).

Metadata (``metadata_props``; onnxruntime's ``custom_metadata_map``) holds the class names, their
tasks, the input size and range, the preprocessing as strict JSON (decode, resize filter, channel
order, scaling; :mod:`sbcli.serve.preprocess` implements it), the normalisation applied inside, the
precision, the method, the inference rule and the learner's provenance, all as strings (JSON for
lists and tables).

``half=True`` stores fp16 weights and computes in fp16; the input and output stay float32 (cast
inside the graph), so clients do not change. Its parity tolerance is :data:`HALF_TOLERANCE`.

A file is only reported written after it ran in onnxruntime on exemplar-memory images and matched
PyTorch; a failed check leaves nothing at the output path. Written files follow the umask (0644
under the usual 022), so a server running as another user can read them.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from sbcli import __version__
from sbcli.atomic import replacing
from sbcli.data.device import Normalization
from sbcli.errors import ExportError
from sbcli.learner.state import Learner
from sbcli.methods.inference import scoring_module
from sbcli.serve import preprocess
from sbcli.serve.providers import require_onnxruntime

logger = logging.getLogger(__name__)
INPUT_NAME = "images"
OUTPUT_NAME = "logits"
META_FORMAT = "2"  # 2: strict-JSON `preprocess` and `normalization`, `precision`, `opset`
EXTRA_HINT = 'install the ONNX extra: pip install "sbcli[onnx]" (or "sbcli[onnx-gpu]")'
#: Opsets that this release exported and checked in onnxruntime (torch's exporter starts at 18).
MIN_OPSET, MAX_OPSET = 18, 25
#: fp16 parity: |ONNX fp16 - PyTorch fp32| <= HALF_TOLERANCE * max(1, largest |score|), and the
#: argmax agrees on at least HALF_ARGMAX of the check images (near-ties may flip in fp16).
HALF_TOLERANCE = 2e-2
HALF_ARGMAX = 0.98


@dataclass(frozen=True)
class OnnxConfig:
    """How to export and check.

    Attributes:
        tolerance: the largest allowed |ONNX - PyTorch| score difference, relative to
            max(1, largest |score|); 1e-4 by default.
        check_images: at most this many exemplar images are compared.
        opset: ONNX opset in [MIN_OPSET, MAX_OPSET]; None lets torch pick its default (opset 20 with torch 2.14).
        half: fp16 weights and compute (float32 input and output); checked with HALF_TOLERANCE.
        traced: trace with torch's TorchScript exporter first (torch.export's where it fails): 0.2 s where
            torch.export took 5.2 s for a ResNet-18 x0.25 at 32 px (what `sb serve LEARNER` waits for before it
            answers); the same parity check follows. `sb export` keeps torch.export's graph.
    """

    tolerance: float = 1e-4
    check_images: int = 256
    opset: int | None = None
    half: bool = False
    traced: bool = False

    def __post_init__(self) -> None:
        if self.opset is not None and not MIN_OPSET <= self.opset <= MAX_OPSET:
            raise ExportError(f"--opset {self.opset} is outside the supported range {MIN_OPSET} to {MAX_OPSET}; "
                              "choose one in it, or leave it out for the exporter's default.")


@dataclass(frozen=True)
class Parity:
    """How the exported model compared with PyTorch."""

    images: int
    source: str  # "images from the exemplar memory" or "random images, as the learner has no exemplars"
    batch_sizes: tuple[int, ...]
    max_abs_diff: float
    score_scale: float  # max |score| of PyTorch, the scale the tolerance is relative to
    argmax_agreement: float  # fraction in [0, 1]

    def to_json(self) -> dict[str, Any]:
        return {"images": self.images, "source": self.source, "batch_sizes": list(self.batch_sizes),
                "max_abs_diff": self.max_abs_diff, "score_scale": self.score_scale,
                "argmax_agreement": self.argmax_agreement}


@dataclass(frozen=True)
class OnnxReport:
    """What ``export_onnx`` wrote and how it checked."""

    path: Path
    bytes: int
    num_classes: int
    image_size: int
    inference: str
    parity: Parity
    precision: str = "float32"
    opset: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "bytes": self.bytes, "num_classes": self.num_classes,
                "image_size": self.image_size, "inference": self.inference, "precision": self.precision,
                "opset": self.opset, "parity": self.parity.to_json()}


class ServingModel(nn.Module):
    """Images in [0, 1] -> normalisation -> the learner's scoring module."""

    def __init__(self, scorer: nn.Module, norm: Normalization) -> None:
        super().__init__()
        self.scorer = scorer
        self.register_buffer("mean", torch.tensor(norm.mean, dtype=torch.float32).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(norm.std, dtype=torch.float32).view(1, 3, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.scorer((images - self.mean) / self.std)


class HalfModel(nn.Module):
    """A ServingModel in fp16: float32 images in, cast to fp16, float32 scores out."""

    def __init__(self, model: ServingModel) -> None:
        super().__init__()
        self.model = copy.deepcopy(model).half()
        self.eval()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images.to(torch.float16)).float()


def inference_rule(learner: Learner) -> str:
    """The learner's inference rule (``wa``, ``none``, ``bic``, ``nme``, ...)."""
    return learner.state.method_config.inference


def serving_model(learner: Learner) -> ServingModel:
    """The learner as one eval-mode module on the CPU: [0, 1] images -> scores over every seen class.

    Raises:
        ExportError: the learner's inference rule has no single-module form.
        LearnerError: the learner has no classes yet (nothing to score).
    """
    learner.state.require_classes("export or serve")
    model = learner.model.cpu().eval()
    extra = {k: v.cpu() for k, v in learner.extra.items()}
    scorer = scoring_module(model, extra, inference_rule(learner))
    return ServingModel(scorer, learner.norm).eval()


def metadata(learner: Learner, cfg: OnnxConfig = OnnxConfig()) -> dict[str, str]:
    """The strings stored in the model's ``metadata_props`` (JSON where structured, strict)."""
    s = learner.state
    spec = preprocess.for_model(s.image_size, s.norm.mean, s.norm.std)
    return {
        "sbcli_format": META_FORMAT,
        "sbcli_version": __version__,
        "class_names": json.dumps(s.class_names),
        "class_tasks": json.dumps(s.class_task),
        "input_name": INPUT_NAME,
        "input_size": json.dumps([3, s.image_size, s.image_size]),
        "input_range": "[0, 1]",
        "input_layout": "NCHW, RGB, float32, any batch size",
        "preprocess": json.dumps(spec.to_json()),
        "normalization": json.dumps({**s.norm.to_json(), "where": "inside_graph"}),
        "precision": "float16" if cfg.half else "float32",
        "output": f"{OUTPUT_NAME}: scores [batch, {s.num_classes}] over class_names; the highest is the prediction",
        "method": s.method,
        "inference": inference_rule(learner),
        "steps": str(s.steps),
        "arch": f"{s.arch} x{s.width}",
        "provenance": json.dumps(s.provenance.to_json()),
    }


def _require_onnx() -> None:
    for name in ("onnx", "onnxscript", "onnxruntime"):
        try:
            __import__(name)
        except ImportError as err:
            raise ExportError(f"ONNX export needs the '{name}' package; {EXTRA_HINT}.") from err


def export_proto(model: nn.Module, image_size: int, cfg: OnnxConfig) -> Any:
    """Trace ``model`` into an ``onnx.ModelProto`` with a dynamic batch axis (no file written)."""
    example = torch.rand(2, 3, image_size, image_size)
    if cfg.traced:
        traced = _traced_proto(model, example, cfg)
        if traced is not None:
            return traced
    batch = torch.export.Dim("batch")
    program = torch.onnx.export(model, (example,), None, dynamo=True, external_data=False, verbose=False,
                                input_names=[INPUT_NAME], output_names=[OUTPUT_NAME], opset_version=cfg.opset,
                                dynamic_shapes={"images": {0: batch}})
    return program.model_proto


def _traced_proto(model: nn.Module, example: torch.Tensor, cfg: OnnxConfig) -> Any | None:
    """``model`` through the TorchScript exporter, or None where it fails (torch.export's graph is made instead)."""
    import io
    import warnings

    import onnx

    buffer = io.BytesIO()
    was_training = model.training
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # the TorchScript exporter's notice of its successor, and a tracer's doubts (shape checks become
            # constants at the one input size served): the parity check that follows decides
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (example,), buffer, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                              dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                              opset_version=cfg.opset, dynamo=False)
    except Exception as err:  # noqa: BLE001  torch.export's exporter is tried next; its own error is the one told
        logger.debug("The TorchScript exporter failed (%s); exporting with torch.export.", err)
        return None
    finally:
        model.train(was_training)  # the exporter may leave the module in training mode
    return onnx.load_model_from_string(buffer.getvalue())


def add_metadata(proto: Any, meta: dict[str, str], steps: int) -> None:
    """Write ``meta`` into ``proto.metadata_props`` (replacing keys of the same name)."""
    import onnx

    kept = [p for p in proto.metadata_props if p.key not in meta]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    for key, value in meta.items():
        proto.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    proto.doc_string = "sbcli class-incremental classifier: [0, 1] NCHW RGB images -> scores over every class seen."
    proto.model_version = steps


def check_images(learner: Learner, limit: int) -> tuple[torch.Tensor, str]:
    """Up to ``limit`` float [0, 1] images spread over the exemplar memory; where the memory lacks
    classes (a learner grown without it), the carried test sample too; random ones if neither has any."""
    size = learner.state.image_size
    images, labels = learner.memory.tensors()
    memory = images if len(images) and images.shape[-1] == size else images[:0]
    sample = learner.test_sample
    covered = len(memory) and len(labels.unique()) == learner.state.num_classes
    parts, names = [], []
    if len(memory):
        parts.append(memory)
        names.append("the exemplar memory")
    if not covered and sample is not None and len(sample):
        parts.append(sample.images)
        names.append("the carried test sample")
    if parts:
        pool = torch.cat(parts)
        idx = torch.linspace(0, len(pool) - 1, min(limit, len(pool))).round().long().unique()
        return pool[idx].float() / 255.0, "images from " + " and ".join(names)
    gen = torch.Generator().manual_seed(0)
    return torch.rand(min(limit, 64), 3, size, size, generator=gen), "random images, as the learner has no exemplars"


def ort_session(path: Path, threads: int | None = None) -> Any:
    """An onnxruntime CPU session on ``path`` (``threads`` intra-op threads, default: its own choice),
    with its logging kept to errors."""
    ort = require_onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@torch.no_grad()
def compare(model: nn.Module, path: Path, images: torch.Tensor, source: str) -> Parity:
    """Run ``images`` through PyTorch and onnxruntime (all at once, then the first one alone)."""
    session = ort_session(path)
    ref = model(images).numpy()
    got = session.run([OUTPUT_NAME], {INPUT_NAME: images.numpy()})[0]
    single = session.run([OUTPUT_NAME], {INPUT_NAME: images[:1].numpy()})[0]
    diff = max(float(np.abs(got - ref).max()), float(np.abs(single - ref[:1]).max()))
    agree = float((got.argmax(1) == ref.argmax(1)).mean())
    scale = float(np.abs(ref).max())
    return Parity(len(images), source, (len(images), 1), diff, scale, agree)


def export_onnx(learner: Learner, out: Path, cfg: OnnxConfig = OnnxConfig()) -> OnnxReport:
    """Export ``learner`` to ``out`` and check it in onnxruntime against PyTorch.

    Raises:
        ExportError: the ONNX packages are missing, the inference rule cannot be exported, or the
            exported model disagrees with PyTorch (then nothing is left at ``out``).
        LearnerError: the learner has no classes yet.
    """
    _require_onnx()
    import onnx

    out = Path(out)
    model = serving_model(learner)
    start = time.perf_counter()
    proto = export_proto(HalfModel(model) if cfg.half else model, learner.state.image_size, cfg)
    logger.debug("Traced step %d to ONNX in %.2f s", learner.state.steps, time.perf_counter() - start)
    meta = metadata(learner, cfg)
    meta["opset"] = str(next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")))
    add_metadata(proto, meta, learner.state.steps)
    onnx.checker.check_model(proto)
    out.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out) as tmp:  # a parity failure leaves nothing behind
        onnx.save_model(proto, str(tmp))
        start = time.perf_counter()
        parity = compare(model, tmp, *check_images(learner, cfg.check_images))
        logger.debug("Checked it against PyTorch on %d images in %.2f s", parity.images, time.perf_counter() - start)
        _require_parity(parity, cfg)
    return OnnxReport(out, out.stat().st_size, learner.state.num_classes, learner.state.image_size,
                      inference_rule(learner), parity, meta["precision"], int(meta["opset"]))


def _require_parity(parity: Parity, cfg: OnnxConfig) -> None:
    tolerance = max(cfg.tolerance, HALF_TOLERANCE) if cfg.half else cfg.tolerance
    limit = tolerance * max(1.0, parity.score_scale)
    if not parity.max_abs_diff <= limit:  # also catches NaN
        raise ExportError(f"The ONNX model's scores differ from PyTorch by {parity.max_abs_diff:.3g} (allowed {limit:.3g}) "
                          "on the check images; nothing was written. Report this with the learner attached.")
    if cfg.half and not parity.argmax_agreement >= HALF_ARGMAX:
        raise ExportError(f"The fp16 ONNX model's top-1 agrees with PyTorch on only {100 * parity.argmax_agreement:.1f} % "
                          f"of the check images (at least {100 * HALF_ARGMAX:.0f} % needed); nothing was written. "
                          "Export without --half.")

