"""`sb rollback`: make an earlier kept step of a learner current again."""

from __future__ import annotations

from typing import Annotated

import typer

from sbcli.cli import paths
from sbcli.cli._errors import friendly_errors
from sbcli.cli._options import JsonOpt, LearnerArg
from sbcli.cli.console import plain

EPILOG = """Examples:

  sb rollback my-learner 2          # step 2 is current again; steps 3.. stay until the next add-task

  sb rollback my-learner 3          # and forward again, while step 3 is still kept
"""


@friendly_errors
def rollback(
    learner: LearnerArg,
    step: Annotated[int, typer.Argument(help="The kept step to make current (see `sb evaluate LEARNER`).", show_default=False)],
    json_out: JsonOpt = False,
) -> None:
    """Make kept step N of a learner current again (later steps are kept until the next add-task)."""
    paths.learner(learner)  # before torch loads: a mistyped path answers at once
    from sbcli import api
    from sbcli.cli import render

    result = api.rollback(learner, step)

    def show() -> None:
        kept = ", ".join(str(n) for n in result["kept_steps"])
        if result["step"] == result["previous"]:
            render.OUT.print(f"{plain(learner)} is already at step {step}; nothing changed (kept steps: {kept}).", highlight=False)
            return
        render.OUT.print(f"{plain(learner)} is at step {step} again ({result['classes']} classes; it was at step "
                         f"{result['previous']}). Kept steps: {kept}; the next add-task replaces the steps after {step}.",
                         highlight=False)

    render.Output(json_out).result(result, show)
