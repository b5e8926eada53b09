"""`sb train`: start a learner on the demo, a benchmark or a class-per-folder directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from sbcli.cli._errors import friendly_errors
from sbcli.cli._options import (
    DATA,
    METHOD,
    OUT,
    ArchOpt,
    BatchSizeOpt,
    ClassesOpt,
    CompileOpt,
    DataRootOpt,
    DeviceOpt,
    DownloadOpt,
    EpochsOpt,
    JsonOpt,
    KeepOpt,
    LrOpt,
    MemoryOpt,
    NoTestSampleOpt,
    OrderSeedOpt,
    PrecisionOpt,
    SeedOpt,
    SelectionOpt,
    TestOpt,
    WidthOpt,
)

EPILOG = """Examples:

  sb train                                                   # the bundled demo, minutes on a CPU

  sb train cifar100 --tasks 10 --method sb --out runs/c100-sb10

  sb train ./photos/train --test ./photos/val --out my-learner
"""

# What a run uses when an option is not given: the paper's settings for benchmarks, and a
# CPU-sized budget for the bundled demo so that `sb train` alone ends in a few minutes.
GLOBAL_DEFAULTS = {"method": "sb", "arch": "resnet18", "lr": 0.1, "selection": "random", "seed": 0, "order_seed": 0}
DEMO_DEFAULTS = {"tasks": 5, "width": 0.25, "epochs": 4, "batch_size": 64, "memory": 200}
PAPER_DEFAULTS = {"tasks": 10, "width": 1.0, "epochs": 200, "batch_size": 256, "memory": 2000}
FOLDER_DEFAULTS = {"tasks": 1, "width": 1.0, "epochs": 30, "batch_size": 128, "memory": 2000}


def defaults_for(source: str | None) -> dict:
    if source in (None, "demo"):
        return {**GLOBAL_DEFAULTS, **DEMO_DEFAULTS}
    if source in ("cifar10", "cifar100", "tiny-imagenet"):
        return {**GLOBAL_DEFAULTS, **PAPER_DEFAULTS}
    return {**GLOBAL_DEFAULTS, **FOLDER_DEFAULTS}


@friendly_errors
def train(
    source: Annotated[Optional[str], typer.Argument(help="demo (default), cifar10, cifar100, tiny-imagenet, a Tiny-ImageNet zip/dir, or a class-per-folder directory.", show_default=False)] = None,
    test: TestOpt = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Learner directory to write.", rich_help_panel=OUT)] = Path("runs/learner"),
    resume: Annotated[bool, typer.Option("--resume", help="Continue the sequence in --out from its last completed step.", rich_help_panel=OUT)] = False,
    keep: KeepOpt = None,
    data_root: DataRootOpt = None,
    download: DownloadOpt = False,
    image_size: Annotated[Optional[int], typer.Option("--image-size", help="Training resolution for folders (default 32).", rich_help_panel=DATA, show_default=False)] = None,
    tasks: Annotated[Optional[int], typer.Option("--tasks", help="Number of equal-size tasks.", rich_help_panel=DATA, show_default=False)] = None,
    base: Annotated[Optional[int], typer.Option("--base", help="Classes of the first task (then --increment per task).", rich_help_panel=DATA, show_default=False)] = None,
    increment: Annotated[Optional[int], typer.Option("--increment", help="Classes of every later task.", rich_help_panel=DATA, show_default=False)] = None,
    classes: ClassesOpt = None,
    no_test_sample: NoTestSampleOpt = False,
    order_seed: OrderSeedOpt = None,
    recipe: Annotated[Optional[str], typer.Option("--recipe", help="A named recipe (e.g. paper-10) or a recipe .toml file; options given override it.", rich_help_panel=METHOD, show_default=False)] = None,
    method: Annotated[Optional[str], typer.Option("--method", help="sb (default), std, finetune, ... (`sb methods` lists them).", rich_help_panel=METHOD, show_default=False)] = None,
    inference: Annotated[Optional[str], typer.Option("--inference", help="wa or none (std, sb); more with other methods.", rich_help_panel=METHOD, show_default=False)] = None,
    rho: Annotated[Optional[float], typer.Option("--rho", help="sb: split ratio factor (paper 1.0 to 1.4).", rich_help_panel=METHOD, show_default=False)] = None,
    sparsity: Annotated[Optional[str], typer.Option("--sparsity", help="sb: 'code' (authors' group lasso) or 'paper'.", rich_help_panel=METHOD, show_default=False)] = None,
    gamma: Annotated[Optional[float], typer.Option("--gamma", help="sb: weight of the sparsity penalty.", rich_help_panel=METHOD, show_default=False)] = None,
    bn_reset: Annotated[Optional[bool], typer.Option("--bn-reset/--no-bn-reset", help="sb: reset stage-4 BatchNorm at disconnect and bridge (authors' code).", rich_help_panel=METHOD, show_default=False)] = None,
    phase_epochs: Annotated[Optional[str], typer.Option("--phase-epochs", help="sb: epochs of phases A,B,C, e.g. 200,200,200.", rich_help_panel=METHOD, show_default=False)] = None,
    arch: ArchOpt = None,
    width: WidthOpt = None,
    epochs: EpochsOpt = None,
    batch_size: BatchSizeOpt = None,
    lr: LrOpt = None,
    memory: MemoryOpt = None,
    selection: SelectionOpt = None,
    compile: CompileOpt = False,
    precision: PrecisionOpt = "auto",
    seed: SeedOpt = None,
    device: DeviceOpt = "auto",
    json_out: JsonOpt = False,
) -> None:
    """Start a learner: learn a task sequence and save it after every step."""
    from sbcli.cli.runs import build_options, run_training

    given = {k: v for k, v in locals().items() if k not in ("json_out", "keep")}
    seq, run, out_dir = build_options(given, defaults_for(source))
    run_training(seq, run, out_dir, resume=resume, keep=keep, json_out=json_out)
