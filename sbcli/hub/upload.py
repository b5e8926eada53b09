"""What a push uploads, staged in a temporary folder: the learner, its ONNX export and its card.

The staged learner is the local one with three differences, each stated in the card: the
exemplar memory is empty unless ``--with-memory`` was given (it holds training images); every
task's data source is its public record (names and fingerprints: a format-1 learner's absolute
paths are cut to the folder's name, so no pushed file shows the pusher's file layout or user
name); and the README.md and model.onnx are written fresh for this step.
"""

from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sbcli.data.names import shown
from sbcli.data.source_records import public_record

ONNX_FILE = "model.onnx"
CARD_FILE = "README.md"


@dataclass(frozen=True)
class Upload:
    """Where a push goes and what it holds besides the learner's weights."""

    repo_id: str
    with_memory: bool = False
    branches: list[str] = field(default_factory=list)  # step-N branches on the Hub after the push
    license: str = "unknown"


def public_state(state: Any) -> Any:
    """A copy of a learner state whose data sources are public records (no machine paths)."""
    out = copy.deepcopy(state)
    out.tasks = [replace(task, source=public_record(task.source)) for task in out.tasks]
    if out.plan is not None:
        out.plan = replace(out.plan, source=public_record(out.plan.source))
    return out


def staged_files(folder: Path) -> list[str]:
    """Every file under ``folder`` as a repository path (hidden files, e.g. a lock, left out)."""
    names = (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return sorted(n for n in names if not any(part.startswith(".") for part in n.split("/")))


def stage(learner_dir: Path, work: Path, upload: Upload, onnx_cfg: Any) -> tuple[Path, list[str], Any]:
    """Write what a push uploads into ``work/upload``: learner files, ONNX (checked), model card.

    Returns the folder, its file names and the ONNX report.
    """
    from sbcli.export.onnx import export_onnx, inference_rule
    from sbcli.hub.card import CardFacts, model_card
    from sbcli.learner.state import Learner
    from sbcli.methods.memory import ExemplarMemory

    learner = Learner.load(learner_dir, "cpu")
    report = export_onnx(learner, work / ONNX_FILE, onnx_cfg)  # checked on the exemplars, before they are dropped
    if not upload.with_memory:
        settings = learner.state.memory
        learner.memory = ExemplarMemory(settings.budget, settings.selection, settings.seed)
    learner.state = public_state(learner.state)
    folder = work / "upload"
    learner.publish(folder)
    shutil.move(work / ONNX_FILE, folder / ONNX_FILE)
    files = sorted([*staged_files(folder), CARD_FILE])
    sample = learner.test_sample
    facts = CardFacts(upload.repo_id, inference_rule(learner), len(learner.memory), 0 if sample is None else len(sample),
                      files, list(upload.branches), upload.license)
    (folder / CARD_FILE).write_text(shown(model_card(learner.state, facts)), encoding="utf-8")  # names not UTF-8: \xNN
    return folder, files, report
