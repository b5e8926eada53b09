"""Shared ``Annotated`` options of the commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

DATA, OPT, OUT, METHOD = "Data", "Optimisation", "Output", "Method"

LearnerArg = Annotated[Path, typer.Argument(help="A learner directory written by `sb train`.", show_default=False)]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.", rich_help_panel=OPT)]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Seed of weights, batches, augmentation and exemplar choice (default 0).", rich_help_panel=OPT, show_default=False)]
EpochsOpt = Annotated[Optional[int], typer.Option("--epochs", help="Epochs of every phase (paper: 200).", rich_help_panel=OPT, show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout instead of tables.", rich_help_panel=OUT)]
TestOpt = Annotated[Optional[Path], typer.Option("--test", help="Class-per-folder test images of the same classes.", rich_help_panel=DATA, show_default=False)]
