"""The persisted learner: a directory readable without unpickling anything.

| file | holds |
|---|---|
| ``learner.json`` | format version, network, input size, normalisation, classes and their tasks, method and hyperparameters, partition, history, provenance |
| ``model.safetensors`` | network weights (head sized to the classes seen) plus method state (e.g. NME class means) |
| ``memory.safetensors`` | exemplar images (uint8, training resolution) and their labels |

Saves are atomic: the new directory is written beside the old one and swapped in, so a crash
leaves the previous learner intact.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from sbcli.data import carried_sample
from sbcli.data.carried_sample import CarriedSample
from sbcli.data.device import Normalization
from sbcli.errors import LearnerError
from sbcli.memory import ExemplarMemory
from sbcli.nets import create_model
from sbcli.nets.resnet import IncrementalResNet

FORMAT_VERSION = 1
FILES = ("learner.json", "model.safetensors", "memory.safetensors")
EXTRA_PREFIX = "extra."


@dataclass
class LearnerState:
    """The JSON half of a learner (everything but tensors)."""

    arch: str
    width: float
    image_size: int
    normalization: dict
    method: str
    method_config: dict
    train_config: dict
    memory: dict  # budget, selection, seed
    seed: int
    class_names: list[str] = field(default_factory=list)
    class_task: list[int] = field(default_factory=list)
    tasks: list[dict] = field(default_factory=list)  # per step: classes, train and test source
    history: list[dict] = field(default_factory=list)  # per step: metrics, phases, records
    plan: dict | None = None  # a whole sequence: source and scenario, for --resume
    provenance: dict = field(default_factory=dict)
    test_sample: dict = field(default_factory=dict)  # the carried test sample: cap, images per class, declined tasks
    format_version: int = FORMAT_VERSION

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def steps(self) -> int:
        return len(self.history)


@dataclass
class Learner:
    """A model, its exemplar memory and its state; see the module docstring for the format."""

    state: LearnerState
    model: IncrementalResNet
    memory: ExemplarMemory
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    test_sample: CarriedSample | None = None

    @property
    def norm(self) -> Normalization:
        return Normalization.from_json(self.state.normalization)

    def save(self, path: Path) -> None:
        """Write the learner to ``path`` atomically (write beside, then swap)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        try:
            self._write(tmp)
            _swap_in(tmp, path)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)

    def _write(self, folder: Path) -> None:
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
        tensors.update({EXTRA_PREFIX + k: v.detach().cpu().contiguous() for k, v in self.extra.items()})
        save_file(tensors, str(folder / "model.safetensors"))
        images, labels = self.memory.tensors()
        save_file({"images": images.contiguous(), "labels": labels.contiguous()}, str(folder / "memory.safetensors"))
        if self.test_sample is not None:
            save_file(self.test_sample.tensors(), str(folder / carried_sample.FILE))
        text = json.dumps(asdict(self.state), indent=2, allow_nan=True)
        (folder / "learner.json").write_text(text + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path, device: torch.device | str = "cpu") -> "Learner":
        """Read a learner directory (no pickle). Raises LearnerError on a missing file or newer format."""
        path = Path(path)
        state = read_state(path)
        model = create_model(state.arch, state.num_classes, state.width)
        tensors = load_file(str(path / "model.safetensors"))
        extra = {k[len(EXTRA_PREFIX):]: v for k, v in tensors.items() if k.startswith(EXTRA_PREFIX)}
        weights = {k: v for k, v in tensors.items() if not k.startswith(EXTRA_PREFIX)}
        try:
            model.load_state_dict(weights)
        except RuntimeError as err:
            raise LearnerError(f"{path}/model.safetensors does not match learner.json ({err.args[0].splitlines()[0]}); "
                               "the learner is corrupt, restore it from a copy.") from err
        memory = _load_memory(path, state)
        return cls(state, model.to(device), memory, extra, _load_sample(path, state))


def read_state(path: Path) -> LearnerState:
    """Check a learner directory and parse its learner.json."""
    if not path.is_dir():
        raise LearnerError(f"No learner at {path}; give the directory that `sb train --out` wrote.")
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise LearnerError(f"The learner at {path} is missing {', '.join(missing)}; restore the directory from a copy.")
    try:
        data: dict[str, Any] = json.loads((path / "learner.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise LearnerError(f"{path}/learner.json is not valid JSON ({err}); restore it from a copy.") from err
    version = data.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise LearnerError(f"The learner at {path} has format version {version}, newer than this sbcli reads "
                           f"({FORMAT_VERSION}); upgrade sbcli.")
    try:
        return LearnerState(**data)
    except TypeError as err:
        raise LearnerError(f"{path}/learner.json has unexpected fields ({err}); restore it from a copy.") from err


def _load_memory(path: Path, state: LearnerState) -> ExemplarMemory:
    tensors = load_file(str(path / "memory.safetensors"))
    memory = ExemplarMemory(**state.memory)
    if len(tensors["labels"]):
        memory.images, memory.labels = tensors["images"], tensors["labels"].long()
    return memory


def _load_sample(path: Path, state: LearnerState) -> CarriedSample | None:
    if not state.test_sample:
        return None
    file = path / carried_sample.FILE
    if not file.is_file():
        raise LearnerError(f"The learner at {path} is missing {carried_sample.FILE}, which learner.json records; "
                           "restore the directory from a copy.")
    return carried_sample.check(load_file(str(file)), state.test_sample, state.num_classes, state.image_size, file)


def _swap_in(new: Path, target: Path) -> None:
    """Replace ``target`` with ``new``: rename the old one aside, rename the new one in, delete the old."""
    if not target.exists():
        os.replace(new, target)
        return
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    os.replace(target, old)
    try:
        os.replace(new, target)
    except OSError:
        os.replace(old, target)
        raise
    shutil.rmtree(old)
