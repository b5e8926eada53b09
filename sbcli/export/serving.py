"""What serving a learner directory needs from the torch side, handed to :mod:`sbcli.serve` by the CLI.

:mod:`sbcli.serve` holds only onnxruntime, numpy and Pillow. A learner directory is the one thing
it cannot open alone, so the caller hands it in:

- ``sb predict LEARNER``: :func:`open_learner`, the learner run in PyTorch (the graph the ONNX
  file is exported from);
- ``sb serve LEARNER``: :data:`EXPORTER`, this module's name: it implements
  :class:`sbcli.serve.source.LearnerExporter` (:func:`learner_onnx`, :func:`kept_steps`,
  :func:`step_onnx`: the learner and each kept step exported to the serve cache). A name rather
  than the functions, because each ``--workers`` process finds it again from its configuration.
  Each of the three runs in a child interpreter (``python -m sbcli.export.serving``), so that the
  server itself never imports torch: serving a learner directory then holds what serving its
  ``.onnx`` holds (torch alone took a server from about 94 to 858 MiB).

Nothing here imports torch until a learner is opened in this process (:func:`open_learner`).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sbcli import errors
from sbcli.serve import preprocess
from sbcli.serve.cache import cache_dir

EXPORTER = "sbcli.export.serving"


@dataclass
class TorchClassifier:
    """A learner directory, run in PyTorch (the graph the ONNX file is exported from)."""

    path: Path
    model: Any  # sbcli.export.onnx.ServingModel
    class_names: list[str]
    image_size: int
    device: Any  # torch.device
    preprocess: preprocess.Preprocess
    provenance: dict[str, Any]
    kind: str = "learner"

    @property
    def provider(self) -> str:
        return f"pytorch-{self.device.type}"

    def scores(self, images: np.ndarray) -> np.ndarray:
        import torch

        from sbcli.engine.device import exact_float32

        with torch.no_grad(), exact_float32(self.device):
            return self.model(torch.from_numpy(images).to(self.device)).float().cpu().numpy()

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path), "provider": self.provider, "classes": self.class_names,
                "input_size": [3, self.image_size, self.image_size], "preprocess": self.preprocess.to_json(),
                "provenance": self.provenance}


def open_learner(path: Path, device: str = "auto") -> TorchClassifier:
    """A learner directory in PyTorch on ``device`` (imports torch)."""
    from sbcli.engine.device import resolve_device
    from sbcli.export.onnx import serving_model
    from sbcli.learner.state import Learner

    dev = resolve_device(device)
    learner = Learner.load(path, "cpu")
    s = learner.state
    return TorchClassifier(Path(path), serving_model(learner).to(dev), list(s.class_names), s.image_size, dev,
                           preprocess.for_model(s.image_size, s.normalization), s.provenance.to_json())


def learner_onnx(learner_dir: Path) -> Path:
    """The learner exported to the serve cache (reused while learner.json is unchanged), by a child interpreter."""
    return Path(_in_child("learner", str(learner_dir)))


def kept_steps(learner_dir: Path) -> dict[int, dict[str, str]]:
    """The kept steps of a learner that have classes and are not past its current step (a rollback leaves later ones),
    with their files."""
    return {int(n): files for n, files in _in_child("steps", str(learner_dir)).items()}


def step_onnx(learner_dir: Path, step: int, files: dict[str, str]) -> Path:
    """Kept step ``step`` exported to the serve cache (its files never change, so it is exported once)."""
    return Path(_in_child("step", str(learner_dir), str(step), json.dumps(files)))


CHILD_TIMEOUT_S = 3600  # an export of a large learner on a slow CPU; a hung child is not waited on forever


def _in_child(*args: str) -> Any:
    """This module's own command in a new interpreter (torch loads there, not in the server); its JSON answer.

    Raises:
        SbcliError: the child's one sentence, as the error class it raised (a damaged learner stays a
            LearnerError); ExportError when the child died without one.
    """
    try:
        done = subprocess.run([sys.executable, "-m", "sbcli.export.serving", *args], capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as err:
        raise errors.ExportError(f"Exporting the learner for serving took over {CHILD_TIMEOUT_S} s; export it with "
                                 "`sb export` and serve the .onnx file.") from err
    if done.returncode == 0:
        return json.loads(done.stdout)
    kind, _, sentence = (done.stdout.strip().splitlines() or [""])[-1].partition(" ")
    error = getattr(errors, kind, None)
    if isinstance(error, type) and issubclass(error, errors.SbcliError) and sentence:
        raise error(sentence)
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise errors.ExportError(f"Exporting the learner for serving failed ({last[:200]}); run `sb export` on it to see why.")


def _learner_onnx(learner_dir: Path) -> Path:
    """The learner exported to the serve cache (reused while learner.json is unchanged; imports torch)."""
    key = hashlib.sha256(str(learner_dir.resolve()).encode() + b"\0" + (learner_dir / "learner.json").read_bytes())
    out = cache_dir() / f"{learner_dir.resolve().name}-{key.hexdigest()[:16]}.onnx"
    if not out.is_file():
        from sbcli.export.onnx import OnnxConfig, export_onnx
        from sbcli.learner.state import Learner
        from sbcli.learner.store.outputs import check_output_file

        check_output_file(out, overwrite=False)
        export_onnx(Learner.load(learner_dir, "cpu"), out, OnnxConfig())  # atomic: concurrent workers each write a complete file
    return out


def _kept_steps(learner_dir: Path) -> dict[int, dict[str, str]]:
    """The kept steps of a learner that are not past its current step (a rollback leaves later ones), with their files;
    not step 0 of a learner pulled as a backbone (no classes to score)."""
    from sbcli.learner.state import served_steps

    return served_steps(learner_dir)


def _step_onnx(learner_dir: Path, step: int, files: dict[str, str]) -> Path:
    """Kept step ``step`` exported to the serve cache (its files never change, so it is exported once)."""
    key = hashlib.sha256(f"{learner_dir.resolve()}\0{step}\0{json.dumps(files, sort_keys=True)}".encode())
    out = cache_dir() / f"{learner_dir.resolve().name}-step{step}-{key.hexdigest()[:16]}.onnx"
    if not out.is_file():
        from sbcli.export.onnx import OnnxConfig, export_onnx
        from sbcli.learner.state import Learner
        from sbcli.learner.store.outputs import check_output_file

        out.parent.mkdir(parents=True, exist_ok=True)
        check_output_file(out, overwrite=True)
        export_onnx(Learner.load(learner_dir, "cpu", step), out, OnnxConfig())
    return out


def _main(argv: list[str]) -> int:
    """``python -m sbcli.export.serving learner DIR | steps DIR | step DIR N FILES``: the answer as JSON on stdout,
    or the error's class and sentence on its last line (exit 1)."""
    command, folder = argv[0], Path(argv[1])
    try:
        if command == "learner":
            answer: Any = str(_learner_onnx(folder))
        elif command == "steps":
            answer = {str(n): files for n, files in _kept_steps(folder).items()}
        else:
            answer = str(_step_onnx(folder, int(argv[2]), json.loads(argv[3])))
    except errors.SbcliError as err:
        sys.stdout.write(f"{type(err).__name__} {' '.join(str(err).split())}\n")
        return 1
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
