"""`sb export`: the learner as one ONNX file, a Triton model repository, or pushed to the Hugging Face
Hub with a model card."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from sbcli.cli import paths
from sbcli.cli._errors import friendly_errors
from sbcli.cli._options import OUT, JsonOpt, LearnerArg, QuietOpt, StepOpt
from sbcli.cli.console import plain

FORMATS = ("onnx", "triton")
HUB = "Hub"

EPILOG = """Examples:

  sb export my-learner --format onnx -o model.onnx

  sb export my-learner --step 2 -o step2.onnx --overwrite       # a kept earlier step
  sb export my-learner --half --opset 21 -o model-fp16.onnx     # fp16 weights and compute

  sb export my-learner --int8 -o model-int8.onnx               # int8 for CPUs, checked against the float model

  sb export my-learner --format triton -o model_repository      # model_repository/my-learner/{config.pbtxt,labels.txt,N/model.onnx}: one version per kept step

  sb export my-learner --to-hub user/my-learner                 # main and branch step-N

  sb export my-learner --to-hub user/my-learner --with-memory   # also share the exemplar images
"""

HalfOpt = Annotated[bool, typer.Option("--half", help="fp16 weights and compute (input and output stay float32); checked against PyTorch within 2e-2 of the score scale and 98 % top-1 agreement.", rich_help_panel=OUT)]
OpsetOpt = Annotated[Optional[int], typer.Option("--opset", help="ONNX opset, 18 to 25 (default: the exporter's, 20 with torch 2.14).", rich_help_panel=OUT, show_default=False)]
Int8Opt = Annotated[bool, typer.Option("--int8", help="Statically quantised int8 (QDQ, per-channel weights) calibrated on the learner's exemplar memory or test sample; refused below --int8-min-agreement.", rich_help_panel=OUT)]
Int8AgreementOpt = Annotated[float, typer.Option("--int8-min-agreement", help="Least top-1 agreement of the int8 model with the float one on the carried test sample (a fraction).", rich_help_panel=OUT)]
TokenOpt = Annotated[Optional[str], typer.Option("--token", help="Hub access token (default: HF_TOKEN or the stored login).", rich_help_panel=HUB, show_default=False)]


def parity_line(parity: dict) -> str:
    """One line: how the ONNX model compared with PyTorch."""
    sizes = " and ".join(str(b) for b in parity["batch_sizes"])
    return (f"ONNX check on {parity['images']} {parity['source']} (batches of {sizes}): "
            f"max |ONNX - PyTorch| = {parity['max_abs_diff']:.2e} (scores up to {parity['score_scale']:.3g}), "
            f"argmax agreement {100 * parity['argmax_agreement']:.1f} %")


def _check_step(step: int | None, format_: str, to_hub: str | None) -> None:
    """--step names a kept step for one ONNX file; a push and a Triton repository take the current step."""
    if step is not None and (to_hub is not None or format_ != "onnx"):
        raise typer.BadParameter("a push or a Triton repository takes the current step; `sb rollback` to the step "
                                 "first, or drop --step.", param_hint="--step")


@friendly_errors
def export(
    learner: LearnerArg,
    format_: Annotated[str, typer.Option("--format", "-f", help="Export format: onnx, or triton (a Triton Inference Server model repository).", rich_help_panel=OUT)] = "onnx",
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="ONNX file to write (default: ./LEARNER.onnx; with --to-hub only if given).", rich_help_panel=OUT, show_default=False)] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing -o file.", rich_help_panel=OUT)] = False,
    step: StepOpt = None,
    to_hub: Annotated[Optional[str], typer.Option("--to-hub", help="Push the learner, its ONNX file and a model card to OWNER/NAME (main and branch step-N).", rich_help_panel=HUB, show_default=False)] = None,
    with_memory: Annotated[bool, typer.Option("--with-memory", help="Also push the exemplar memory (it holds training images).", rich_help_panel=HUB)] = False,
    private: Annotated[bool, typer.Option("--private", help="Create the Hub repository as private.", rich_help_panel=HUB)] = False,
    token: TokenOpt = None,
    half: HalfOpt = False,
    opset: OpsetOpt = None,
    int8: Int8Opt = False,
    int8_min_agreement: Int8AgreementOpt = 0.98,
    license_: Annotated[str, typer.Option("--license", help="License id for the model card (a Hub license id, e.g. apache-2.0, mit, cc-by-4.0).", rich_help_panel=HUB)] = "unknown",
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Export a learner: an ONNX classifier checked against PyTorch, or a push to the Hub."""
    paths.learner(learner)  # before torch loads: a mistyped path answers at once
    from sbcli import api
    from sbcli.cli import progress, render

    if format_ not in FORMATS:
        raise typer.BadParameter(f"'{format_}' is not a format; choose one of: {', '.join(FORMATS)}.", param_hint="--format")
    _check_step(step, format_, to_hub)
    if int8:
        _check_int8(format_, to_hub, half)
        _int8(learner, out, step, overwrite, opset, int8_min_agreement, json_out, quiet)
        return
    result: dict = {}
    if format_ == "triton":
        if to_hub is not None:
            raise typer.BadParameter("--format triton writes a local model repository; push with --format onnx.", param_hint="--to-hub")
        _triton(learner, out, half, opset, json_out, quiet)
        return
    with progress.reporter(quiet) as reporter:
        if to_hub is None or out is not None:
            path = out or Path(f"{learner.resolve().name}.onnx")
            with reporter.status(f"Exporting {learner} to {path} and checking it against PyTorch in onnxruntime"):
                result["onnx"] = api.export_onnx(learner, path, half=half, opset=opset, step=step,
                                                   overwrite=overwrite).to_json()
        if to_hub is not None:
            memory = " with its exemplar memory" if with_memory else ""
            with reporter.status(f"Pushing {learner} to {to_hub}{memory} (ONNX export and parity check first)"):
                result["hub"] = api.push(learner, to_hub, with_memory=with_memory, private=private, token=token,
                                         license=license_).to_json()

    def show() -> None:
        for report in (result.get("onnx"), result.get("hub", {}).get("onnx")):
            if report is not None:
                render.OUT.print(parity_line(report["parity"]))
        if "onnx" in result:
            r = result["onnx"]
            render.OUT.print(f"Wrote {plain(r['path'])} ({r['bytes'] / 1e6:.1f} MB): {r['num_classes']} classes, input [N, 3, "
                             f"{r['image_size']}, {r['image_size']}] in [0, 1], inference {r['inference']}, "
                             f"{r['precision']}, opset {r['opset']}")
        if "hub" in result:
            h = result["hub"]
            revisions = " and ".join(f"{name} ({commit[:10]})" for name, commit in h["revisions"].items())
            render.OUT.print(f"Pushed {', '.join(h['files'])} to {plain(h['url'])}: revisions {revisions}")
            if "main" not in h["revisions"]:
                render.OUT.print("main was left as it is: it holds a later step of this sequence.")

    render.Output(json_out).result(result, show)


def _check_int8(format_: str, to_hub: str | None, half: bool) -> None:
    if format_ != "onnx" or to_hub is not None:
        raise typer.BadParameter("--int8 writes one ONNX file; drop --format triton and --to-hub.", param_hint="--int8")
    if half:
        raise typer.BadParameter("--int8 and --half are two ways to shrink the model; choose one.", param_hint="--int8")


def int8_lines(r: dict) -> list[str]:
    """What the int8 check found, and what was written."""
    ev = r["evaluation"]
    lines = [f"int8 check on {ev['images']} images of {ev['source']}: top-1 agreement with the float model "
             f"{100 * r['agreement']:.1f} % (at least {100 * r['min_agreement']:.1f} % needed)"]
    if r["float_accuracy"] is not None:
        lines.append(f"Accuracy on {ev['source']}: float32 {100 * r['float_accuracy']:.1f} %, int8 {100 * r['int8_accuracy']:.1f} %")
    lines.append(f"Wrote {r['path']} ({r['bytes'] / 1e6:.2f} MB, float32 {r['float_bytes'] / 1e6:.2f} MB): int8 QDQ, "
                 f"weights per channel, calibrated on {r['calibration']['images']} images of {r['calibration']['source']}")
    return lines


def _int8(learner: Path, out: Optional[Path], step: Optional[int], overwrite: bool, opset: Optional[int],
          min_agreement: float, json_out: bool, quiet: bool) -> None:
    from sbcli import api
    from sbcli.cli import progress, render

    path = out or Path(f"{learner.resolve().name}-int8.onnx")
    with progress.reporter(quiet) as reporter, reporter.status(f"Exporting {learner} to {path} as int8 and checking it"):
        report = api.export_int8(learner, path, min_agreement=min_agreement, opset=opset, step=step,
                                 overwrite=overwrite).to_json()
    if json_out:
        render.print_json({"int8": report})
        return
    render.OUT.print(parity_line(report["float_parity"]))
    for line in int8_lines(report):
        render.OUT.print(line)


def _triton(learner: Path, out: Optional[Path], half: bool, opset: Optional[int], json_out: bool, quiet: bool) -> None:
    """`--format triton`: a model repository at OUT (default ./model_repository)."""
    from sbcli import api
    from sbcli.cli import progress, render

    repo = out or Path("model_repository")
    with progress.reporter(quiet) as reporter, reporter.status(f"Exporting {learner} to the Triton model repository {repo}"):
        report = api.export_triton(learner, repo, half=half, opset=opset).to_json()

    def show() -> None:
        render.OUT.print(parity_line(report["onnx"]["parity"]))
        versions = ", ".join(map(str, report["versions"]))
        render.OUT.print(f"Wrote {plain(report['model_dir'])}: {', '.join(report['files'])} (versions {versions}: the learner's kept "
                         f"steps; {report['onnx']['num_classes']} classes at the latest, dynamic batching); serve it with tritonserver --model-repository={repo}")

    render.Output(json_out).result(report, show)
