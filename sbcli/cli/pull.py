"""`sb pull`: a zoo entry or a Hub repository, verified and installed as a learner directory."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Optional

import typer

from sbcli.cli._errors import friendly_errors
from sbcli.cli._options import OUT, JsonOpt, QuietOpt
from sbcli.cli.console import cell, plain

HUB = "Hub"

EPILOG = """Examples:

  sb pull --list                                   # the zoo

  sb pull demo-sb-tiny -o my-learner               # bundled: works offline

  sb pull resnet50-in1k-ridge -o mine               # a backbone with no classes yet: then

  sb add-task mine photos/train --test photos/test  # learns yours in one pass

  sb pull user/my-learner@step-2 -o step2           # a Hub repository at a task step

  sb pull cifar10-lite0-ridge-5 --data cifar10.zip -o c10   # built here, offline, from your copy of its data
"""


def zoo_table(entries: list[dict]):
    """One row per entry (the descriptions are in ``--json``)."""
    from rich import box

    from sbcli.cli import render

    table = render.Table(title="The sbcli zoo (`sb pull --list --json` for descriptions, hashes and metrics)",
                         box=box.SIMPLE_HEAD)
    for col in ("name", "where", "dataset", "model", "classes", "last %"):
        table.add_column(col, justify="right" if col in ("classes", "last %") else "left",
                         no_wrap=col == "name", overflow="fold", min_width=len("unpublished") if col == "where" else None)
    for e in entries:
        # a bundled entry's path inside sbcli is an install detail (it is in --json)
        # the kind of place; a Hub repository with the first 12 hex digits of its commit (the whole of both in --json)
        where = e["kind"] if e["kind"] != "hub" else f"{e['location'].removeprefix('hub:')}@{e['revision'][:12]}"
        dataset = e["dataset"].split(":")[0].split(" (")[0]
        classes = "none yet" if e["holds"] == "backbone" else f"{e['classes']} in {len(e['tasks'])} tasks"
        network = "the backbone" if e["holds"] == "backbone" else e["network"]  # a backbone's is where it lives
        # an index may come from anywhere (--index): its text is shown as written, never as markup
        table.add_row(cell(e["name"]), cell(where), cell(dataset), cell(f"{e['method']} + {e['inference']}, {network}"),
                      cell(classes), render.fmt(e["metrics"].get("last")))
    return table


@friendly_errors
def pull(
    ref: Annotated[Optional[str], typer.Argument(help="A zoo name (see --list) or OWNER/NAME on the Hub, with an optional @REVISION (e.g. @step-2).", show_default=False)] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Learner directory to create (default: ./NAME or ./NAME-REVISION).", rich_help_panel=OUT, show_default=False)] = None,
    list_: Annotated[bool, typer.Option("--list", help="Show the zoo and exit.", rich_help_panel=OUT)] = False,
    data: Annotated[Optional[Path], typer.Option("--data", help="For a zoo entry built on this machine (where: build): a zip file or folder of its data; the entry's images are checked by SHA-256 before it learns them.", show_default=False)] = None,
    index: Annotated[Optional[Path], typer.Option("--index", help="Another zoo index file (default: the one bundled with sbcli).", show_default=False)] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Use only the local cache (as HF_HUB_OFFLINE=1 does).", rich_help_panel=HUB)] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the Hub before using the cache.", rich_help_panel=HUB)] = 10.0,
    token: Annotated[Optional[str], typer.Option("--token", help="Hub access token (default: HF_TOKEN or the stored login).", rich_help_panel=HUB, show_default=False)] = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Download a pretrained learner (zoo name or Hub repository) and print where it is. A backbone entry of the zoo
    becomes a learner with no classes yet, which `sb add-task` grows from your first folder."""
    from sbcli import api
    from sbcli.cli import render

    if list_:
        entries = [e.to_json() for e in api.zoo(index)]
        render.Output(json_out).result(entries, lambda: render.OUT.print(zoo_table(entries)))
        return
    if ref is None:
        raise typer.BadParameter("give a zoo name or OWNER/NAME to pull, or --list to see the zoo.", param_hint="REF")
    if quiet and importlib.util.find_spec("huggingface_hub") is not None:
        from huggingface_hub.utils import disable_progress_bars  # its own download bars on stderr

        disable_progress_bars()
    if data is None:
        report = api.pull(ref, out, index=index, offline=offline, timeout=timeout, token=token)
    else:
        from sbcli.cli import progress

        reporter = progress.reporter(quiet, every=None)
        with reporter:
            reporter.note(f"Building {plain(ref)} from {plain(data)}")
            report = api.pull(ref, out, index=index, offline=offline, timeout=timeout, token=token, data=data,
                              on_progress=[reporter])

    def show() -> None:
        if quiet:
            typer.echo(str(report.path))
            return
        checked = f"{len(report.verified)} files verified against the zoo index" if report.verified else "no zoo hashes to check"
        cache = ", from the local cache" if report.from_cache else ""
        render.ERR.print(f"Pulled {plain(report.origin)}{cache}: {checked}.", highlight=False, soft_wrap=True)
        for note in report.notes:
            render.ERR.print(f"Note: {plain(note)}.", highlight=False, soft_wrap=True)
        grow = f"sb add-task {report.path} FOLDER --test FOLDER"
        then = grow if report.contents.get("classes") == 0 else f"sb evaluate {report.path}  |  {grow}"  # none yet: grow it
        render.ERR.print(f"Continue with: {plain(then)}", highlight=False, soft_wrap=True)
        typer.echo(str(report.path))

    render.Output(json_out).result(report.to_json(), show)
