"""`sb predict`: what a learner or its exported ONNX file answers for some images.

An .onnx file runs in onnxruntime without importing torch (nor sbcli.api), so it starts fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from sbcli.cli import paths
from sbcli.cli._errors import friendly_errors
from sbcli.cli._options import OUT, DeviceOpt, JsonOpt
from sbcli.cli.console import cell, plain

EPILOG = """Examples:

  sb predict model.onnx photo.jpg photos/            # table of top-3 labels

  sb predict model.onnx photos/ --provider cuda      # onnxruntime-gpu's CUDA provider, or an error

  sb predict my-learner photos/ --top-k 1 --json      # the learner in PyTorch
"""

ProviderOpt = Annotated[str, typer.Option("--provider", help="onnxruntime provider for an .onnx file: auto (TensorRT, then CUDA, then CPU, among those that load), cpu, cuda or tensorrt.")]


@friendly_errors
def predict(
    model: Annotated[Path, typer.Argument(help="A learner directory or an .onnx file written by `sb export`.", show_default=False)],
    images: Annotated[list[Path], typer.Argument(help="Image files, or folders searched for images.", show_default=False)],
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="How many labels to show per image.", rich_help_panel=OUT)] = 3,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Images scored at once.")] = 64,
    provider: ProviderOpt = "auto",
    device: DeviceOpt = "auto",
    json_out: JsonOpt = False,
) -> None:
    """Top-k labels with probabilities for image files or folders."""
    paths.model(model)  # before torch or onnxruntime loads: a mistyped path answers at once
    paths.images(images)
    from sbcli.cli import render
    from sbcli.export.serving import open_learner
    from sbcli.serve.predict import predict as run_predict

    report = run_predict(model, images, top_k=top_k, batch_size=batch_size, device=device, provider=provider,
                         open_learner=open_learner)

    def show() -> None:
        render.ERR.print(f"{plain(model)}: {report.kind} on provider {report.provider}", highlight=False)
        predictions = report.predictions  # file paths and class names are the user's text: cells, never markup
        table = render.Table(title=cell(f"{model}: top {min(top_k, len(predictions[0].labels))} of {len(predictions)} "
                                        f"images (provider {report.provider})"))
        table.add_column("image")
        table.add_column("label")
        table.add_column("probability", justify="right")
        table.add_column("next", justify="left")
        for p in predictions:
            rest = ", ".join(f"{n} {100 * q:.1f} %" for n, q in zip(p.labels[1:], p.probabilities[1:], strict=True))
            table.add_row(cell(p.image), cell(p.labels[0]), f"{100 * p.probabilities[0]:.1f} %", cell(rest))
        render.OUT.print(table)

    render.Output(json_out).result(report.to_json(), show)
    _fail_if_any(report.failed, len(report.predictions), render)


def _fail_if_any(failed: list, predicted: int, render: Any) -> None:
    """One line on stderr per file that could not be read, then exit 1 (the readable ones were predicted)."""
    if not failed:
        return
    for failure in failed:
        render.ERR.print(f"[bold red]Error:[/] {plain(failure.error)}", highlight=False, soft_wrap=True)
    render.ERR.print(f"{len(failed)} of {predicted + len(failed)} images could not be read; the other {predicted} "
                     "were predicted.", highlight=False, soft_wrap=True)
    raise typer.Exit(1)
