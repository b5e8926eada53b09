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
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sbcli import errors
from sbcli.serve import preprocess
from sbcli.serve.cache import cache_dir, entry_name

EXPORTER = "sbcli.export.serving"
DEBUG_ENV = "SBCLI_DEBUG"  # set: the child's own timings (torch loaded, learner read, traced, checked) reach the log
logger = logging.getLogger("sbcli.export.serving")  # by name: the child runs it as __main__


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

        from sbcli.engine.hardware import exact_float32

        with torch.no_grad(), exact_float32(self.device):
            return self.model(torch.from_numpy(images).to(self.device)).float().cpu().numpy()

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path), "provider": self.provider, "classes": self.class_names,
                "input_size": [3, self.image_size, self.image_size], "preprocess": self.preprocess.to_json(),
                "provenance": self.provenance}


def open_learner(path: Path, device: str = "auto") -> TorchClassifier:
    """A learner directory in PyTorch on ``device`` (imports torch)."""
    from sbcli.engine.hardware import resolve_device
    from sbcli.export.onnx import serving_model
    from sbcli.learner.state import Learner

    dev = resolve_device(device)
    learner = Learner.load(path, "cpu")
    s = learner.state
    return TorchClassifier(Path(path), serving_model(learner).to(dev), list(s.class_names), s.image_size, dev,
                           preprocess.for_model(s.image_size, s.norm.mean, s.norm.std), s.provenance.to_json())


def learner_onnx(learner_dir: Path) -> Path:
    """The learner exported to the serve cache (reused while learner.json is unchanged): found in this process when
    the cache holds it (a warm start starts no interpreter), else exported by a child interpreter."""
    cached = _learner_cache_path(learner_dir)
    if cached.is_file():
        logger.debug("The current step of %s is in the serve cache: %s", learner_dir, cached.name)
        return cached
    return Path(_in_child("learner", str(learner_dir)))


def kept_steps(learner_dir: Path) -> dict[int, dict[str, str]]:
    """The kept steps of a learner that have classes and are not past its current step (a rollback leaves later ones),
    with their files: read from the serve cache when it holds them for this learner.json (a warm start starts no
    interpreter: listing them imports torch), else listed by a child interpreter."""
    cached = _steps_cache_path(learner_dir)
    listed = json.loads(cached.read_text()) if cached.is_file() else _in_child("steps", str(learner_dir))
    logger.debug("Listed the kept steps of %s (%s): %s", learner_dir, "from the serve cache" if cached.is_file()
                 else "by a child interpreter", ", ".join(sorted(listed, key=int)) or "none")
    return {int(n): files for n, files in listed.items()}


def step_onnx(learner_dir: Path, step: int, files: dict[str, str]) -> Path:
    """Kept step ``step`` exported to the serve cache (its files never change, so it is exported once)."""
    return cached_step_onnx(learner_dir, step, files) or Path(_in_child("step", str(learner_dir), str(step), json.dumps(files)))


def cached_step_onnx(learner_dir: Path, step: int, files: dict[str, str]) -> Path | None:
    """Kept step ``step``'s ONNX file when the serve cache holds it (no interpreter, no torch), else None."""
    out = _step_cache_path(learner_dir, step, files)
    return out if out.is_file() else None


def _learner_cache_path(learner_dir: Path) -> Path:
    """Where the learner's current step is kept in the serve cache: named by its path and its learner.json."""
    key = hashlib.sha256(str(learner_dir.resolve()).encode() + b"\0" + (learner_dir / "learner.json").read_bytes())
    return cache_dir() / entry_name(learner_dir.resolve().name, key.hexdigest()[:16], ".onnx")


def _steps_cache_path(learner_dir: Path) -> Path:
    """Where the learner's kept steps are listed in the serve cache: a function of learner.json (its commit point)."""
    onnx = _learner_cache_path(learner_dir)
    return onnx.with_name(onnx.name.removesuffix(".onnx") + ".steps.json")


def _step_cache_path(learner_dir: Path, step: int, files: dict[str, str]) -> Path:
    """Where kept step ``step`` is kept in the serve cache: named by the SHA-256 of its files' bytes (a step's files
    never change once committed), so a copy of the learner, or one moved, finds the same export."""
    digest = hashlib.sha256()
    for role, name in sorted(files.items()):
        digest.update(f"{role}\0{len(name)}\0".encode())
        digest.update(hashlib.sha256((learner_dir / name).read_bytes()).digest())
    return cache_dir() / entry_name(learner_dir.resolve().name, f"step{step}-{digest.hexdigest()[:16]}", ".onnx")


CHILD_TIMEOUT_S = 3600  # an export of a large learner on a slow CPU; a hung child is not waited on forever


def _in_child(*args: str) -> Any:
    """This module's own command in a new interpreter (torch loads there, not in the server); its JSON answer.

    Raises:
        SbcliError: the child's one sentence, as the error class it raised (a damaged learner stays a
            LearnerError); ExportError when the child died without one.
    """
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "sbcli.export.serving", *args], capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as err:
        raise errors.ExportError(f"Exporting the learner for serving took over {CHILD_TIMEOUT_S} s; export it with "
                                 "`sb export` and serve the .onnx file.") from err
    if logger.isEnabledFor(logging.DEBUG):
        for line in done.stderr.splitlines():
            if line.startswith("+"):  # the child's timings (:data:`DEBUG_ENV`)
                logger.debug("  child %s", line)
        logger.debug("The child interpreter (%s) answered in %.2f s", args[0], time.perf_counter() - start)
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
    out = _learner_cache_path(learner_dir)
    if not out.is_file():
        from sbcli.export.onnx import OnnxConfig, export_onnx
        from sbcli.learner.state import Learner
        from sbcli.learner.store.outputs import check_output_file

        check_output_file(out, overwrite=False)
        learner = Learner.load(learner_dir, "cpu")
        logger.debug("Read the learner")
        export_onnx(learner, out, OnnxConfig(traced=True))  # atomic: concurrent workers each write a complete file
        _kept_steps(learner_dir)  # listed now, while torch is loaded: the server's next question
    return out


def _kept_steps(learner_dir: Path) -> dict[int, dict[str, str]]:
    """The kept steps of a learner that are not past its current step (a rollback leaves later ones), with their files;
    not step 0 of a learner pulled as a backbone (no classes to score). Kept in the serve cache beside the learner's
    export, named by the learner.json they were read from (read again, so that a save meanwhile names another file)."""
    from sbcli.atomic import write_atomic
    from sbcli.learner.state import served_steps

    before = _steps_cache_path(learner_dir)
    steps = served_steps(learner_dir)
    if _steps_cache_path(learner_dir) == before:
        write_atomic(before, json.dumps({str(n): files for n, files in steps.items()}))
    return steps


def _step_onnx(learner_dir: Path, step: int, files: dict[str, str]) -> Path:
    """Kept step ``step`` exported to the serve cache (its files never change, so it is exported once)."""
    out = _step_cache_path(learner_dir, step, files)
    if not out.is_file():
        from sbcli.export.onnx import OnnxConfig, export_onnx
        from sbcli.learner.state import Learner
        from sbcli.learner.store.outputs import check_output_file

        out.parent.mkdir(parents=True, exist_ok=True)
        check_output_file(out, overwrite=True)
        learner = Learner.load(learner_dir, "cpu", step)
        logger.debug("Read step %d of the learner", step)
        export_onnx(learner, out, OnnxConfig(traced=True))
    return out


def _os_sentence(err: OSError) -> str:
    """Why an export for serving could not read or write a file, and what to do: a cache that cannot be written is
    a container's read-only file system more often than not, so that case names the way to give it another."""
    from sbcli.serve.cache import CONTAINER_HINT

    where = Path(err.filename) if err.filename else None
    try:
        in_cache = where is not None and where.resolve().is_relative_to(cache_dir().resolve())
    except errors.SbcliError:
        in_cache = True  # no cache can be written at all
    what = f"{where}" if where is not None else "a file"
    if in_cache:
        return f"Could not write the serve cache ({what}: {err.strerror or err}); {CONTAINER_HINT}."
    return f"Could not read or write {what} while exporting the learner for serving ({err.strerror or err}); check it."


def _main(argv: list[str]) -> int:
    """``python -m sbcli.export.serving learner DIR | steps DIR | step DIR N FILES``: the answer as JSON on stdout,
    or the error's class and sentence on its last line (exit 1)."""
    command, folder = argv[0], Path(argv[1])
    if os.environ.get(DEBUG_ENV) == "1":
        logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="+%(relativeCreated).0f ms %(message)s")
        logging.getLogger("sbcli").setLevel(logging.DEBUG)
        import torch  # noqa: F401  timed here, once, rather than inside whichever import loads it first

        logger.debug("torch loaded")
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
    except OSError as err:  # a file system's refusal: said in one sentence, where it happened
        sys.stdout.write(f"ExportError {_os_sentence(err)}\n")
        return 1
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    code = _main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the answer is out: tearing torch down took 1.5 s more of the server's start
