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
KeepOpt = Annotated[Optional[int], typer.Option("--keep", help="Keep the files of only the last N steps (default: every step, for --step and `sb rollback`).", rich_help_panel=OUT, show_default=False)]
StepOpt = Annotated[Optional[int], typer.Option("--step", help="Use kept step N of the learner instead of its current one.", show_default=False)]
TestOpt = Annotated[Optional[Path], typer.Option("--test", help="Class-per-folder test images of the same classes.", rich_help_panel=DATA, show_default=False)]

# Options shared by `sb train` and `sb bench` (one definition, one help text).
DataRootOpt = Annotated[Optional[str], typer.Option("--data-root", help="Where cifar10/cifar100 live (torchvision layout) or the Tiny-ImageNet dir/zip.", rich_help_panel=DATA, show_default=False)]
DownloadOpt = Annotated[bool, typer.Option("--download", help="Let torchvision download CIFAR into --data-root.", rich_help_panel=DATA)]
OrderSeedOpt = Annotated[Optional[int], typer.Option("--order-seed", help="Class order seed: 0 (default) as in the S&B code, 1993 as in iCaRL/PyCIL, -1 keeps the dataset's order.", rich_help_panel=DATA, show_default=False)]
ArchOpt = Annotated[Optional[str], typer.Option("--arch", help="resnet18 (default) or resnet32.", rich_help_panel=OPT, show_default=False)]
WidthOpt = Annotated[Optional[float], typer.Option("--width", help="Width multiplier (paper 1.0; 0.25 for small runs).", rich_help_panel=OPT, show_default=False)]
BatchSizeOpt = Annotated[Optional[int], typer.Option("--batch-size", help="Batch size (paper: 256).", rich_help_panel=OPT, show_default=False)]
LrOpt = Annotated[Optional[float], typer.Option("--lr", help="Initial learning rate (default 0.1).", rich_help_panel=OPT, show_default=False)]
MemoryOpt = Annotated[Optional[int], typer.Option("--memory", help="Exemplar budget over all classes (paper: 2000).", rich_help_panel=OPT, show_default=False)]
SelectionOpt = Annotated[Optional[str], typer.Option("--selection", help="Exemplar choice: random (default), herding or first.", rich_help_panel=OPT, show_default=False)]
ClassesOpt = Annotated[Optional[int], typer.Option("--classes", help="Keep only the first N classes of the class order (a smaller benchmark).", rich_help_panel=DATA, show_default=False)]
CompileOpt = Annotated[bool, typer.Option("--compile", help="torch.compile the student and teacher once per phase (minutes to compile; for long GPU runs: no gain measured on CPU).", rich_help_panel=OPT)]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="auto (bf16 autocast where the device computes in bf16 natively: recent GPUs, CPUs with AVX-512 BF16 or AMX; float32 elsewhere), bf16 or fp32.", rich_help_panel=OPT)]

# Options about what a learner carries and where its test sets are (`sb train`, `sb add-task`, `sb evaluate`).
NoTestSampleOpt = Annotated[bool, typer.Option("--no-test-sample", help="Keep this data's test images out of the learner (private data); by default it carries up to 100 per class so that `sb evaluate` works anywhere.", rich_help_panel=DATA)]
TestRootsOpt = Annotated[Optional[list[Path]], typer.Option("--data-root", help="Where the learner's original test folders are now (repeatable); each is used when its fingerprint is the recorded one.", rich_help_panel=DATA, show_default=False)]
