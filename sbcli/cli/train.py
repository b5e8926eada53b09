"""`sb train`: start a learner on the demo, a benchmark or a class-per-folder directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from sbcli.cli import paths
from sbcli.cli._errors import friendly_errors
from sbcli.cli._options import (
    DATA,
    METHOD,
    OUT,
    JsonOpt,
    KeepOpt,
    LogOpt,
    NameOpt,
    NoTestSampleOpt,
    PretrainedHashOpt,
    PretrainedOpt,
    QuietOpt,
    TestOpt,
    with_run_options,
)
from sbcli.defaults import describe

EPILOG = """Examples:

  sb train                                                   # the bundled demo, minutes on a CPU

  sb train cifar100 --tasks 10 --method sb --out runs/c100-sb10

  sb train ./photos/train --test ./photos/val --out my-learner

Your own folders default to STD + WA, --epochs a step at lr 0.01 (no warm-up below lr 0.05), the
step-1 head rules with clipping in every later step, no class-balanced fine-tuning (docs/lab/benchmarks.md,
"Own-data defaults", has what each costs and buys).
"""

@friendly_errors
@with_run_options("train", methods=True)
def train(
    source: Annotated[Optional[str], typer.Argument(help="demo (default), cifar10, cifar100, tiny-imagenet, a Tiny-ImageNet zip/dir, or a class-per-folder directory.", show_default=False)] = None,
    test: TestOpt = None,
    dataset_name: NameOpt = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Learner directory to write (default: a new runs/SOURCE, runs/SOURCE-2, ...).", rich_help_panel=OUT, show_default=False)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the sequence in --out from its last completed step.", rich_help_panel=OUT)] = False,
    keep: KeepOpt = None,
    image_size: Annotated[Optional[int], typer.Option("--image-size", help="Training resolution for folders (default 32; with --pretrained ImageNet weights, the size they were trained at, e.g. 224).", rich_help_panel=DATA, show_default=False)] = None,
    tasks: Annotated[Optional[int], typer.Option("--tasks", help=describe("Number of equal-size tasks", "tasks", "train"), rich_help_panel=DATA, show_default=False)] = None,
    base: Annotated[Optional[int], typer.Option("--base", help="Classes of the first task (then --increment per task).", rich_help_panel=DATA, show_default=False)] = None,
    increment: Annotated[Optional[int], typer.Option("--increment", help="Classes of every later task.", rich_help_panel=DATA, show_default=False)] = None,
    no_test_sample: NoTestSampleOpt = False,
    recipe: Annotated[Optional[str], typer.Option("--recipe", help="A named recipe (e.g. paper-10) or a recipe .toml file; options given override it.", rich_help_panel=METHOD, show_default=False)] = None,
    method: Annotated[Optional[str], typer.Option("--method", help=describe("sb, std, dd, finetune, joint, ranpac, simplecil, ... (`sb methods` lists them); a folder with no --method starts from --pretrained efficientnet-lite0 under ranpac's ridge head (68.5 % last on CIFAR-10 in 5 tasks, where STD + WA from scratch reached 33.0 %); for a folder from scratch (--pretrained none) STD + WA: at the same epochs a step S&B + WA was 7 points behind it on held-out classes (3 seeds); for a folder with other --pretrained weights, ranpac: its ridge head on the frozen backbone led STD + WA fine-tuned, S&B fine-tuned and SimpleCIL on 50 held-out classes in 10 tasks", "method", "train"), rich_help_panel=METHOD, show_default=False)] = None,
    pretrained: PretrainedOpt = None,
    pretrained_sha256: PretrainedHashOpt = None,
    log: LogOpt = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
    **run_options: Any,
) -> None:
    """Start a learner: learn a task sequence and save it after every step."""
    paths.source(source)  # before torch loads: a mistyped path answers at once
    if test is not None:
        paths.folder(test, "test folder")
    from sbcli.cli.rundirs import output_dir
    from sbcli.cli.training import run_training
    from sbcli.config.options import build_options

    given = {"source": source, "test": test, "dataset_name": dataset_name, "out": out, "resume": resume,
             "image_size": image_size, "tasks": tasks, "base": base, "increment": increment,
             "no_test_sample": no_test_sample, "recipe": recipe, "method": method, "pretrained": pretrained,
             "pretrained_sha256": pretrained_sha256}
    seq, run, out_dir = build_options({**given, **run_options})
    out_dir = output_dir(out_dir, resume, seq.source, recipe)  # no --out: a new runs/NAME folder
    run_training(seq, run, out_dir, resume=resume, json_out=json_out, quiet=quiet, log=log or [], keep=keep)
