"""Assemble the `sb` command from one module per command. No torch import here."""

from __future__ import annotations

from typing import Annotated

import typer

from sbcli import __version__
from sbcli.cli import add_task, bench, evaluate, export, forget, predict, pull, rollback, serve, train

app = typer.Typer(
    name="sb",
    help="Grow an image classifier class set by class set with Split-and-Bridge (and its baselines).",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"sbcli {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version_: Annotated[bool, typer.Option("--version", "-V", help="Print the version of sbcli and exit (`sb version` also names torch's).",
                                           callback=_print_version, is_eager=True)] = False,
) -> None:
    """Grow an image classifier class set by class set with Split-and-Bridge (and its baselines)."""


app.command("train", epilog=train.EPILOG)(train.train)
app.command("add-task", epilog=add_task.EPILOG)(add_task.add_task)
app.command("evaluate", epilog=evaluate.EPILOG)(evaluate.evaluate)
app.command("bench", epilog=bench.EPILOG)(bench.bench)
app.command("export", epilog=export.EPILOG)(export.export)
app.command("predict", epilog=predict.EPILOG)(predict.predict)
app.command("pull", epilog=pull.EPILOG)(pull.pull)
app.command("rollback", epilog=rollback.EPILOG)(rollback.rollback)
app.command("forget", epilog=forget.EPILOG)(forget.forget)
app.command("serve", epilog=serve.EPILOG)(serve.serve)


@app.command("methods")
def methods() -> None:
    """List the registered methods and architectures."""
    from sbcli import api

    for name, summary in api.method_summaries().items():
        typer.echo(f"{name:10s} {summary}")
    typer.echo("architectures: " + ", ".join(api.architectures()))


@app.command("version")
def version() -> None:
    """Print the versions of sbcli and torch, and how torch uses the CPU (threads, OpenMP waiting)."""
    import os

    import torch

    wait = os.environ.get("OMP_WAIT_POLICY", "default").lower()
    spin = os.environ.get("GOMP_SPINCOUNT")
    typer.echo(f"sbcli {__version__} torch {torch.__version__} ({torch.get_num_threads()} CPU threads, "
               f"OpenMP waiting {wait}{f' after {spin} spins' if spin else ''})")


def _log_to_stderr() -> None:
    """Library warnings (skipped files, checksum mismatches) reach the user on stderr.

    On a terminal through rich; elsewhere (a pipe, a log file, a container) as plain lines: the
    stderr console is as wide as a line may be there, and rich would pad every record to it.
    """
    import logging
    import sys

    from sbcli.cli._errors import debugging
    from sbcli.cli.render import ERR

    if ERR.is_terminal:
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=ERR, show_time=False, show_path=False, markup=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("sbcli")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    if debugging():  # SBCLI_DEBUG=1: sbcli's debug lines too, each stamped with the milliseconds since the start
        handler.setFormatter(logging.Formatter("+%(relativeCreated).0f ms %(levelname)s %(message)s"))
        logger.setLevel(logging.DEBUG)


def main() -> None:
    """The `sb` entry point: the environment torch needs is set before anything imports torch."""
    from sbcli.cli._errors import debugging, report
    from sbcli.engine.threads import prepare

    prepare()
    _log_to_stderr()
    try:
        app()
    except SystemExit as done:
        leave_torchrun_process(done.code)
        raise
    except (Exception, KeyboardInterrupt) as err:  # outside a command (e.g. at import): still one line
        if debugging():
            raise
        raise SystemExit(report(err)) from None


def leave_torchrun_process(code: int | str | None) -> None:
    """Under torchrun, end the process here, its output flushed, without the interpreter's finalization.

    Every rank has left the process group and rank 0 has committed (and fsynced) the learner by now;
    what is left is C++ static destruction, where a communication thread that is still joinable
    aborts the process ("terminate called without an active exception", SIGABRT) now and then, and
    torchrun then reports a finished job as failed. Outside torchrun this does nothing.
    """
    import os

    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return
    import logging
    import sys

    if isinstance(code, str):
        print(code, file=sys.stderr)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))
