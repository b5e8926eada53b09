"""Where `sb train` writes when no ``--out`` is given: ``runs/<name>``, then ``runs/<name>-2``, ``-3``, ...

The name is the recipe's (``--recipe paper-10`` or a recipe file's stem) or the source's: ``demo``,
``cifar100``, or a folder's or zip's own name. An existing directory is never reused, so a second
run of the same command starts a new learner beside the first instead of failing.
"""

from __future__ import annotations

import re
from pathlib import Path

from sbcli.errors import ConfigError

RUNS = Path("runs")


def run_name(source: str | None, recipe: str | None = None) -> str:
    """``paper-10``, ``demo``, ``cifar100``, ``tiny-imagenet-100`` (from a path: its last part, suffix dropped)."""
    raw = Path(recipe).stem if recipe else (Path(str(source).rstrip("/\\")).stem if source else "demo")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", raw).strip("-.")
    return name or "run"


def next_run_dir(name: str, root: Path = RUNS) -> Path:
    """``root/name`` if it does not exist, else the first free ``root/name-2``, ``root/name-3``, ..."""
    candidate, n = Path(root) / name, 1
    while candidate.exists():
        n += 1
        candidate = Path(root) / f"{name}-{n}"
    return candidate


def output_dir(out: str | Path | None, resume: bool, source: str | None, recipe: str | None = None) -> Path:
    """``--out`` as given, or a new run directory when it is not.

    Raises:
        ConfigError: ``--resume`` without ``--out`` (which learner to continue is not a guess).
    """
    if out is not None:
        return Path(out)
    if resume:
        raise ConfigError("--resume needs --out: the learner directory to continue, e.g. --out runs/demo.")
    return next_run_dir(run_name(source, recipe))
