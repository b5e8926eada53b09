"""Shared ``Annotated`` options of the commands."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

DATA, OPT, OUT, METHOD = "Data", "Optimisation", "Output", "Method"

LearnerArg = Annotated[Path, typer.Argument(help="A learner directory written by `sb train`.", show_default=False)]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.", rich_help_panel=OPT)]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Seed of weights, batches, augmentation and exemplar choice (default 0).", rich_help_panel=OPT, show_default=False)]
EpochsOpt = Annotated[Optional[int], typer.Option("--epochs", help="Epochs of every phase (paper: 200).", rich_help_panel=OPT, show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout instead of tables.", rich_help_panel=OUT)]
KeepOpt = Annotated[Optional[int], typer.Option("--keep", help="Keep the files of only the last N steps (default: every step, for --step and `sb rollback`).", rich_help_panel=OUT, show_default=False)]
StepOpt = Annotated[Optional[int], typer.Option("--step", help="Use kept step N of the learner instead of its current one.", show_default=False)]
TestOpt = Annotated[Optional[Path], typer.Option("--test", help="Class-per-folder test images of the same classes.", rich_help_panel=DATA, show_default=False)]

# Options shared by `sb train` and `sb bench` (one definition, one help text).
DataRootOpt = Annotated[Optional[str], typer.Option("--data-root", help="Where cifar10/cifar100 live (torchvision layout) or the Tiny-ImageNet dir/zip.", rich_help_panel=DATA, show_default=False)]
DownloadOpt = Annotated[bool, typer.Option("--download", help="Let torchvision download CIFAR into --data-root.", rich_help_panel=DATA)]
OrderSeedOpt = Annotated[Optional[int], typer.Option("--order-seed", help="Class order seed: 0 (default) as in the S&B code, 1993 as in iCaRL/PyCIL, -1 keeps the dataset's order.", rich_help_panel=DATA, show_default=False)]
ArchOpt = Annotated[Optional[str], typer.Option("--arch", help="resnet18 (default), resnet32 (CIFAR-style, 32-64 px), resnet18-in or resnet34-in (ImageNet-style, for photos at --image-size 128 or 224).", rich_help_panel=OPT, show_default=False)]
WidthOpt = Annotated[Optional[float], typer.Option("--width", help="Width multiplier (paper 1.0; 0.25 for small runs).", rich_help_panel=OPT, show_default=False)]
BatchSizeOpt = Annotated[Optional[int], typer.Option("--batch-size", help="Batch size (paper: 256).", rich_help_panel=OPT, show_default=False)]
LrOpt = Annotated[Optional[float], typer.Option("--lr", help="Initial learning rate (default 0.1).", rich_help_panel=OPT, show_default=False)]
MemoryOpt = Annotated[Optional[int], typer.Option("--memory", help="Exemplar budget over all classes (paper: 2000).", rich_help_panel=OPT, show_default=False)]
SelectionOpt = Annotated[Optional[str], typer.Option("--selection", help="Exemplar choice: random (default), herding or first.", rich_help_panel=OPT, show_default=False)]
ClassesOpt = Annotated[Optional[int], typer.Option("--classes", help="Keep only the first N classes of the class order (a smaller benchmark).", rich_help_panel=DATA, show_default=False)]
CompileOpt = Annotated[bool, typer.Option("--compile", help="torch.compile the student and teacher once per phase (minutes to compile; for long GPU runs: no gain measured on CPU).", rich_help_panel=OPT)]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="auto (bf16 autocast where the device computes in bf16 natively: recent GPUs, CPUs with AVX-512 BF16 or AMX; float32 elsewhere), bf16 or fp32.", rich_help_panel=OPT)]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr (results and errors only).", rich_help_panel=OUT)]
LogOpt = Annotated[Optional[list[str]], typer.Option("--log", help="Also log to tensorboard or mlflow (repeat for both; extras of the same names).", rich_help_panel=OUT, show_default=False)]
WarmupOpt = Annotated[Optional[float], typer.Option("--warmup-epochs", help="Linear learning-rate warm-up at the start of every phase, in epochs (default 1 in sb train; 0 in sb bench and the paper recipes).", rich_help_panel=OPT, show_default=False)]
ZeroInitOpt = Annotated[Optional[bool], typer.Option("--zero-init-residual/--no-zero-init-residual", help="Start the last BN of every residual block at 0, so each block starts as its shortcut (default off: it stalled the demo's first task, docs/benchmarks.md).", rich_help_panel=OPT, show_default=False)]
PretrainedOpt = Annotated[Optional[str], typer.Option("--pretrained", help="Start the backbone from safetensors weights: a Hub repo OWNER/NAME or OWNER/NAME@REVISION (timm's ResNet names, e.g. timm/resnet18.a1_in1k with --arch resnet18-in, or an sbcli learner) or a local .safetensors file; the head is new.", rich_help_panel=OPT, show_default=False)]
PretrainedHashOpt = Annotated[Optional[str], typer.Option("--pretrained-sha256", help="Refuse --pretrained weights whose SHA-256 differs from this.", rich_help_panel=OPT, show_default=False)]
ValFractionOpt = Annotated[Optional[float], typer.Option("--val-fraction", help="Hold out this share of each new class's images and of the exemplars; every phase keeps its best epoch on them (default 0: the last epoch).", rich_help_panel=OPT, show_default=False)]
ValEveryOpt = Annotated[Optional[int], typer.Option("--val-every", help="With --val-fraction: epochs between validation scores (default: a fifth of the phase).", rich_help_panel=OPT, show_default=False)]
IncrementalLrOpt = Annotated[Optional[float], typer.Option("--incremental-lr", help="Initial learning rate of every phase after the first step (default: --lr).", rich_help_panel=OPT, show_default=False)]
BalanceEpochsOpt = Annotated[Optional[int], typer.Option("--balance-epochs", help="After each later step, fine-tune this many epochs on the class-balanced exemplar memory (default 0: none).", rich_help_panel=OPT, show_default=False)]
BalanceLrOpt = Annotated[Optional[float], typer.Option("--balance-lr", help="Learning rate of that fine-tuning (default 0.01).", rich_help_panel=OPT, show_default=False)]

# The engine's other settings (sbcli.engine.loop.TrainConfig), in `sb train` and `sb bench`; unset: the authors' values.
MomentumOpt = Annotated[Optional[float], typer.Option("--momentum", help="SGD momentum (default 0.9).", rich_help_panel=OPT, show_default=False)]
NesterovOpt = Annotated[Optional[bool], typer.Option("--nesterov/--no-nesterov", help="Nesterov momentum (default on, as in the authors' code).", rich_help_panel=OPT, show_default=False)]
WeightDecayOpt = Annotated[Optional[float], typer.Option("--weight-decay", help="L2 weight decay on every parameter (default 5e-4).", rich_help_panel=OPT, show_default=False)]
MilestonesOpt = Annotated[Optional[str], typer.Option("--milestones", help="Learning-rate drops at these fractions of a phase's epochs (default 0.3,0.6,0.8: 60/120/160 of 200).", rich_help_panel=OPT, show_default=False)]
LrDecayOpt = Annotated[Optional[float], typer.Option("--lr-decay", help="The learning rate is multiplied by this at every milestone (default 0.1).", rich_help_panel=OPT, show_default=False)]
DropLastOpt = Annotated[Optional[bool], typer.Option("--drop-last/--keep-last", help="Drop each epoch's last partial batch (default, as in the authors' code) or train on it.", rich_help_panel=OPT, show_default=False)]
EvalBatchSizeOpt = Annotated[Optional[int], typer.Option("--eval-batch-size", help="Batch size when scoring test images and exemplars (default 1024; no effect on results).", rich_help_panel=OPT, show_default=False)]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", envvar="SBCLI_THREADS", help="CPU compute threads while training and evaluating (default: the cores that other running work leaves free).", rich_help_panel=OPT, show_default=False)]
FirstTaskRulesOpt = Annotated[Optional[bool], typer.Option("--first-task-rules/--no-first-task-rules", help="Step 1 keeps the head bias at zero and clips negative head weights (default on, as in the authors' code).", rich_help_panel=METHOD, show_default=False)]

# The options of a run's data source, network, optimisation and budget, in every command that trains (`sb train`,
# `sb bench`): defined once here, given to each command by `with_run_options`. A new engine setting
# is a TrainConfig field plus one line here.
RUN_OPTIONS: dict[str, tuple[Any, Any]] = {
    "classes": (ClassesOpt, None), "data_root": (DataRootOpt, None), "download": (DownloadOpt, False),
    "order_seed": (OrderSeedOpt, None), "arch": (ArchOpt, None), "width": (WidthOpt, None),
    "epochs": (EpochsOpt, None), "batch_size": (BatchSizeOpt, None), "lr": (LrOpt, None),
    "warmup_epochs": (WarmupOpt, None), "zero_init_residual": (ZeroInitOpt, None), "momentum": (MomentumOpt, None),
    "nesterov": (NesterovOpt, None),
    "weight_decay": (WeightDecayOpt, None), "milestones": (MilestonesOpt, None), "lr_decay": (LrDecayOpt, None),
    "drop_last": (DropLastOpt, None), "eval_batch_size": (EvalBatchSizeOpt, None), "threads": (ThreadsOpt, None),
    "val_fraction": (ValFractionOpt, None), "val_every": (ValEveryOpt, None),
    "incremental_lr": (IncrementalLrOpt, None), "balance_epochs": (BalanceEpochsOpt, None),
    "balance_lr": (BalanceLrOpt, None),
    "memory": (MemoryOpt, None), "selection": (SelectionOpt, None), "compile": (CompileOpt, False),
    "precision": (PrecisionOpt, "auto"), "seed": (SeedOpt, None), "device": (DeviceOpt, "auto"),
}


def with_run_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` (which takes ``**run_options``) every option of :data:`RUN_OPTIONS`, after its own.

    Typer reads a command's options from its signature; this one is the command's own parameters
    followed by the shared ones, and the call passes them all on by name.
    """
    own = inspect.signature(command, eval_str=True)
    params = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
              for name, (annotation, default) in RUN_OPTIONS.items()]

    @functools.wraps(command)
    def with_options(**options: Any) -> Any:
        return command(**options)

    signature = own.replace(parameters=[*params, *shared])
    with_options.__signature__ = signature  # type: ignore[attr-defined]
    with_options.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    return with_options

# Options about what a learner carries and where its test sets are (`sb train`, `sb add-task`, `sb evaluate`).
NoTestSampleOpt = Annotated[bool, typer.Option("--no-test-sample", help="Keep this data's test images out of the learner (private data); by default it carries up to 100 per class so that `sb evaluate` works anywhere.", rich_help_panel=DATA)]
TestRootsOpt = Annotated[Optional[list[Path]], typer.Option("--data-root", help="Where the learner's original test folders are now (repeatable); each is used when its fingerprint is the recorded one.", rich_help_panel=DATA, show_default=False)]
