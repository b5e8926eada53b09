"""`sb train`: start a learner on the demo, a benchmark or a class-per-folder directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from sbcli.cli._errors import friendly_errors
from sbcli.cli._options import (
    DATA,
    METHOD,
    OUT,
    FirstTaskRulesOpt,
    JsonOpt,
    KeepOpt,
    LogOpt,
    NoTestSampleOpt,
    PretrainedHashOpt,
    PretrainedOpt,
    QuietOpt,
    TestOpt,
    with_run_options,
)

EPILOG = """Examples:

  sb train                                                   # the bundled demo, minutes on a CPU

  sb train cifar100 --tasks 10 --method sb --out runs/c100-sb10

  sb train ./photos/train --test ./photos/val --out my-learner
"""

@friendly_errors
@with_run_options
def train(
    source: Annotated[Optional[str], typer.Argument(help="demo (default), cifar10, cifar100, tiny-imagenet, a Tiny-ImageNet zip/dir, or a class-per-folder directory.", show_default=False)] = None,
    test: TestOpt = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Learner directory to write (default: a new runs/SOURCE, runs/SOURCE-2, ...).", rich_help_panel=OUT, show_default=False)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the sequence in --out from its last completed step.", rich_help_panel=OUT)] = False,
    keep: KeepOpt = None,
    image_size: Annotated[Optional[int], typer.Option("--image-size", help="Training resolution for folders (default 32).", rich_help_panel=DATA, show_default=False)] = None,
    tasks: Annotated[Optional[int], typer.Option("--tasks", help="Number of equal-size tasks.", rich_help_panel=DATA, show_default=False)] = None,
    base: Annotated[Optional[int], typer.Option("--base", help="Classes of the first task (then --increment per task).", rich_help_panel=DATA, show_default=False)] = None,
    increment: Annotated[Optional[int], typer.Option("--increment", help="Classes of every later task.", rich_help_panel=DATA, show_default=False)] = None,
    no_test_sample: NoTestSampleOpt = False,
    recipe: Annotated[Optional[str], typer.Option("--recipe", help="A named recipe (e.g. paper-10) or a recipe .toml file; options given override it.", rich_help_panel=METHOD, show_default=False)] = None,
    method: Annotated[Optional[str], typer.Option("--method", help="sb (default), std, finetune, ... (`sb methods` lists them).", rich_help_panel=METHOD, show_default=False)] = None,
    inference: Annotated[Optional[str], typer.Option("--inference", help="Inference rule: sb and dd take wa or none; std takes wa, bic, icarl or none (default wa).", rich_help_panel=METHOD, show_default=False)] = None,
    rho: Annotated[Optional[float], typer.Option("--rho", help="sb: split ratio factor (paper 1.0 to 1.4).", rich_help_panel=METHOD, show_default=False)] = None,
    sparsity: Annotated[Optional[str], typer.Option("--sparsity", help="sb: 'code' (authors' group lasso) or 'paper'.", rich_help_panel=METHOD, show_default=False)] = None,
    gamma: Annotated[Optional[float], typer.Option("--gamma", help="sb: weight of the sparsity penalty (default 1 with --sparsity code, 0.0115 with paper).", rich_help_panel=METHOD, show_default=False)] = None,
    bn_reset: Annotated[Optional[bool], typer.Option("--bn-reset/--no-bn-reset", help="sb: reset stage-4 BatchNorm at disconnect and bridge (authors' code).", rich_help_panel=METHOD, show_default=False)] = None,
    phase_epochs: Annotated[Optional[str], typer.Option("--phase-epochs", help="sb: epochs of phases A,B,C, e.g. 200,200,200.", rich_help_panel=METHOD, show_default=False)] = None,
    first_task_rules: FirstTaskRulesOpt = None,
    bic_val_fraction: Annotated[Optional[float], typer.Option("--bic-val-fraction", help="std --inference bic: share of each class's exemplar quota held out to fit the bias layer (default 0.1).", rich_help_panel=METHOD, show_default=False)] = None,
    aux_epochs: Annotated[Optional[int], typer.Option("--aux-epochs", help="dd: epochs of the temporary new-task network (default: --epochs).", rich_help_panel=METHOD, show_default=False)] = None,
    aux_head_rules: Annotated[Optional[bool], typer.Option("--aux-head-rules/--no-aux-head-rules", help="dd: train the temporary network with step 1's head rules (default off: plain CE).", rich_help_panel=METHOD, show_default=False)] = None,
    wa_clip: Annotated[Optional[bool], typer.Option("--wa-clip/--no-wa-clip", help="std, dd with --inference wa: clip negative head weights in every step, as WA's authors (default off: step 1 only, as S&B's code).", rich_help_panel=METHOD, show_default=False)] = None,
    nme_flips: Annotated[Optional[bool], typer.Option("--nme-flips/--no-nme-flips", help="std --inference icarl: class means over the exemplars and their flips (default on, iCaRL's code; off: PyCIL).", rich_help_panel=METHOD, show_default=False)] = None,
    pretrained: PretrainedOpt = None,
    pretrained_sha256: PretrainedHashOpt = None,
    log: LogOpt = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
    **run_options: Any,
) -> None:
    """Start a learner: learn a task sequence and save it after every step."""
    from sbcli.cli.runs import run_training
    from sbcli.config.options import build_options
    from sbcli.run.rundirs import output_dir

    given = {k: v for k, v in locals().items() if k not in ("json_out", "run_options", "log", "quiet", "keep")}
    seq, run, out_dir = build_options({**given, **run_options})
    out_dir = output_dir(out_dir, resume, seq.source, recipe)  # no --out: a new runs/NAME folder
    run_training(seq, run, out_dir, resume=resume, json_out=json_out, quiet=quiet, log=log or [], keep=keep)
