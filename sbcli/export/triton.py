"""A Triton Inference Server model repository for a learner.

``export_triton(learners, repo)`` writes, all at once or not at all::

    repo/NAME/config.pbtxt     platform onnxruntime_onnx, max_batch_size, dynamic_batching,
                               version_policy all, input `images` [3, S, S] FP32 NCHW,
                               output `logits` [C] FP32 with label_filename
    repo/NAME/labels.txt       the class names, one per line, in output order
    repo/NAME/N/model.onnx     the checked ONNX export of learner step N, for every kept step

Versions are learner steps: Triton serves every one (``version_policy: { all { } }``) and a
request that names no version gets the highest, the learner's current step. A learner's classes
keep their label order from step to step (new classes are appended), so the one labels file is
right for every version; when the versions have different class counts, the output's dims are
``[ -1 ]``.

Triton serves it with ``tritonserver --model-repository=repo``; KServe with a ``triton`` runtime
pointed at the same folder (see docs/export.md). With ``max_batch_size > 0`` Triton adds the batch
axis itself, so dims leave it out. The config is written as protobuf text; the tests parse it with
the ``model_config_pb2`` schema that ``tritonclient`` ships and check it against the ONNX graph.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sbcli.atomic import staging
from sbcli.data.names import name_bytes
from sbcli.errors import ConfigError, ExportError
from sbcli.export.onnx import INPUT_NAME, OUTPUT_NAME, OnnxConfig, OnnxReport, export_onnx
from sbcli.learner.state import Learner

LABELS_FILE = "labels.txt"
CONFIG_FILE = "config.pbtxt"
MODEL_FILE = "model.onnx"


@dataclass(frozen=True)
class TritonConfig:
    """The model's name in the repository (the API passes the learner folder's name) and its batching."""

    name: str | None = None
    max_batch_size: int = 64
    max_queue_delay_us: int = 1000

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_queue_delay_us < 0:
            raise ConfigError("Triton's max batch size must be at least 1 and its queue delay at least 0.")


@dataclass(frozen=True)
class TritonReport:
    """What ``export_triton`` wrote."""

    repository: Path
    model_dir: Path
    name: str
    onnx: OnnxReport  # the latest version's
    versions: tuple[int, ...] = (1,)

    def to_json(self) -> dict[str, Any]:
        return {"repository": str(self.repository), "model_dir": str(self.model_dir), "name": self.name,
                "versions": list(self.versions), "files": [CONFIG_FILE, LABELS_FILE, *(f"{v}/{MODEL_FILE}" for v in self.versions)],
                "onnx": self.onnx.to_json()}


def model_name(cfg: TritonConfig) -> str:
    """A Triton model name: ``cfg.name`` with characters outside [A-Za-z0-9_.-] replaced."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", cfg.name or "").strip(".-") or "sbcli-model"


def config_text(name: str, image_size: int, num_classes: int, cfg: TritonConfig) -> str:
    """config.pbtxt for sbcli ONNX exports (float32 input and output, also for --half); ``num_classes`` -1
    when the versions differ."""
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {cfg.max_batch_size}
version_policy: {{ all {{ }} }}
input [
  {{
    name: "{INPUT_NAME}"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, {image_size}, {image_size} ]
  }}
]
output [
  {{
    name: "{OUTPUT_NAME}"
    data_type: TYPE_FP32
    dims: [ {num_classes} ]
    label_filename: "{LABELS_FILE}"
  }}
]
dynamic_batching {{
  max_queue_delay_microseconds: {cfg.max_queue_delay_us}
}}
"""


def export_triton(learners: Learner | Iterable[Learner], repository: Path, onnx_cfg: OnnxConfig | None = None,
                  cfg: TritonConfig | None = None) -> TritonReport:
    """Write ``repository/NAME`` (config, labels, ``N/model.onnx`` for each learner, N its step).

    ``learners``: one learner, or its kept steps oldest first (loaded one at a time); the last is the current one.

    Raises:
        ExportError: ``repository/NAME`` already exists, a class name holds a line break, or an
            ONNX export fails its check (then nothing is left).
    """
    onnx_cfg, cfg = onnx_cfg or OnnxConfig(), cfg or TritonConfig()
    steps = [learners] if isinstance(learners, Learner) else learners
    repository = Path(repository)
    name = model_name(cfg)
    final = repository / name
    if final.exists():
        raise ExportError(f"{final} already exists; remove it or give another -o repository.")
    repository.mkdir(parents=True, exist_ok=True)
    with staging(final, "triton") as work:  # a SIGKILLed export's folder is removed by the next export here
        work.mkdir()  # mode from the umask, like the model folder it becomes
        versions, counts, last = [], set(), None
        for learner in steps:
            names = learner.state.class_names
            if any("\n" in n or "\r" in n for n in names):
                raise ExportError("A class name holds a line break, which Triton's labels file cannot represent; rename the class.")
            step = learner.state.steps
            (work / str(step)).mkdir()
            report = export_onnx(learner, work / str(step) / MODEL_FILE, onnx_cfg)
            versions.append(step)
            counts.add(len(names))
            last = (learner.state.image_size, names, report)
        if last is None:
            raise ExportError("The learner has no step to export; train it first.")
        image_size, names, report = last
        (work / LABELS_FILE).write_bytes(b"".join(name_bytes(n) + b"\n" for n in names))  # a name's bytes as on disk
        classes = len(names) if len(counts) == 1 else -1
        (work / CONFIG_FILE).write_text(config_text(name, image_size, classes, cfg), encoding="utf-8")
        os.rename(work, final)
    onnx_report = OnnxReport(**{**report.__dict__, "path": final / str(versions[-1]) / MODEL_FILE})
    return TritonReport(repository, final, name, onnx_report, tuple(versions))
