"""The paths a command names, checked before anything heavy is imported (torch takes seconds).

A mistyped path answers in a fraction of a second with the same sentence the full check would say
later; what needs reading (a learner's JSON, the images) is still checked where it is read.
"""

from __future__ import annotations

import re
from pathlib import Path

from sbcli.errors import ConfigError, DataError, LearnerError
from sbcli.source_kinds import BENCHMARKS

STATE_FILE = "learner.json"  # sbcli.learner.store.layout.STATE_FILE (that module imports torch)


# The names sbcli 0.1's save gave its folders (sbcli.learner.store.legacy, which checks what they hold too)
LEFT_BY_0_1 = re.compile(r"(old-[1-9][0-9]{0,6}|tmp-[a-z0-9_]{8})")


def _interrupted_save_beside(path: Path) -> bool:
    """An interrupted save of sbcli 0.1 may have left ``.NAME.tmp-XXXXXXXX`` or ``.NAME.old-<pid>`` beside
    ``path`` (recovered on open, when it holds what that save wrote)."""
    parent, prefix = path.parent, f".{path.name}."
    return parent.is_dir() and any(LEFT_BY_0_1.fullmatch(p.name[len(prefix):]) for p in parent.glob(prefix + "*"))


def learner(path: Path) -> None:
    """``path`` holds a learner (or one an interrupted save left beside it, which opening recovers)."""
    if (path / STATE_FILE).is_file() or _interrupted_save_beside(path):
        return
    raise LearnerError(f"No learner at {path}; give the directory that `sb train --out` wrote.")


def folder(path: Path, what: str = "folder") -> None:
    """``path`` is a directory (class-per-folder images, say)."""
    if not path.is_dir():
        raise DataError(f"The {what} {path} does not exist; give a class-per-folder directory."
                        if not path.exists() else f"The {what} {path} is not a directory; give a class-per-folder directory.")


def source(name: str | None) -> None:
    """`sb train`'s source: a benchmark name or an existing path."""
    if name is None or name in BENCHMARKS or Path(name).expanduser().exists():
        return
    raise DataError(f"{name} is neither a benchmark ({', '.join(BENCHMARKS)}) nor an existing folder; check the path.")


def model(path: Path, triton: bool = False) -> None:
    """A learner directory or an ``.onnx`` file (`sb predict`, `sb serve`); with ``triton`` (`sb serve`) also a
    Triton model folder (numbered N/model.onnx, config.pbtxt optional as in Triton) or a model repository holding
    such folders, as :mod:`sbcli.serve.source` reads them (that module imports numpy and Pillow: not here)."""
    def triton_model(folder: Path) -> bool:
        return not (folder / STATE_FILE).is_file() and any(
            d.name.isdigit() and int(d.name) > 0 and (d / "model.onnx").is_file() for d in folder.iterdir())

    if (path.is_dir() and (path / STATE_FILE).is_file()) or (path.is_file() and path.suffix.lower() == ".onnx"):
        return
    if triton and path.is_dir() and (triton_model(path) or (not (path / "config.pbtxt").exists() and any(
            d.is_dir() and not d.name.startswith(".") and triton_model(d) for d in path.iterdir()))):
        return
    if triton:
        raise ConfigError(f"{path} is neither a learner directory (with learner.json) nor an .onnx file (nor a Triton "
                          "model folder or model repository from `sb export --format triton`); give one of those.")
    raise ConfigError(f"{path} is neither a learner directory (with learner.json) nor an .onnx file; give one of those.")


def images(paths: list[Path]) -> None:
    """Every image path given exists (a file or a folder)."""
    for path in paths:
        if not path.exists():
            raise DataError(f"{path} does not exist; give image files or folders of images.")
