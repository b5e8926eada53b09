"""Stand-in for ``sbcli.validate`` (the validate helper's module) until it is merged: the same names.

Only ``read_safetensors`` does real work here (a malformed file becomes one LearnerError sentence);
the checks are the validate branch's job. Delete this file and import ``sbcli.validate`` at merge.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from sbcli.errors import LearnerError


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise LearnerError(f"{path} is not a readable safetensors file ({err}); restore the learner from a copy.") from err


def check_state_json(data: object, where: Path) -> None:
    del data, where


def check_model_tensors(tensors: dict[str, torch.Tensor], state: object, where: Path) -> None:
    del tensors, state, where


def check_memory_tensors(tensors: dict[str, torch.Tensor], state: object, where: Path) -> None:
    del tensors, state, where
