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
WarmupOpt = Annotated[Optional[float], typer.Option("--warmup-epochs", help="Linear learning-rate warm-up at the start of every phase, in epochs (default 1; the paper recipes: 0).", rich_help_panel=OPT, show_default=False)]
ZeroInitOpt = Annotated[Optional[bool], typer.Option("--zero-init-residual/--no-zero-init-residual", help="Start the last BN of every residual block at 0, so each block starts as its shortcut (default off: it stalled the demo's first task, docs/benchmarks.md).", rich_help_panel=OPT, show_default=False)]
PretrainedOpt = Annotated[Optional[str], typer.Option("--pretrained", help="Start the backbone from safetensors weights: a Hub repo OWNER/NAME or OWNER/NAME@REVISION (timm's ResNet names, e.g. timm/resnet18.a1_in1k with --arch resnet18-in, or an sbcli learner) or a local .safetensors file; the head is new.", rich_help_panel=OPT, show_default=False)]
PretrainedHashOpt = Annotated[Optional[str], typer.Option("--pretrained-sha256", help="Refuse --pretrained weights whose SHA-256 differs from this.", rich_help_panel=OPT, show_default=False)]
ValFractionOpt = Annotated[Optional[float], typer.Option("--val-fraction", help="Hold out this share of each new class's images and of the exemplars; every phase keeps its best epoch on them (default 0: the last epoch).", rich_help_panel=OPT, show_default=False)]
ValEveryOpt = Annotated[Optional[int], typer.Option("--val-every", help="With --val-fraction: epochs between validation scores (default: a fifth of the phase).", rich_help_panel=OPT, show_default=False)]
