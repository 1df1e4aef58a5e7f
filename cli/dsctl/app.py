"""The dsctl command: registers the verbs; main() is the one place errors become exit codes."""

from __future__ import annotations

import os
import signal
import sys
from typing import Annotated

import typer

from dsctl import __version__
from dsctl.commands import engine, estimate, fleet, lab, matrix, probe
from dsctl.errors import DsctlError, ExitStatus

app = typer.Typer(
    name="dsctl",
    help="Take Ascend 910B servers from bare OS to a tuned DeepSeek inference service.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(lab.app, name="lab")
app.add_typer(engine.app, name="engine")
app.command(name="matrix")(matrix.show)
app.command(name="provision")(fleet.provision)
app.command(name="check")(fleet.check)
app.command(name="deploy")(fleet.deploy)
app.command(name="probe")(probe.run)
app.command(name="estimate")(estimate.show)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"dsctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """dsctl: provision, deploy, tune and upgrade Ascend NPU inference fleets."""


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run dsctl; usage errors exit 2 (Typer), DsctlError exits with its status after one stderr line."""
    # A kill or a CI timeout stops dsctl the way Ctrl-C does, so a running playbook is stopped with it.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        app(args=argv, prog_name="dsctl")
    except SystemExit as exc:  # Typer's own exits: --help, usage errors, typer.Exit(code)
        code = exc.code if isinstance(exc.code, int) else int(ExitStatus.OK if exc.code is None else ExitStatus.ERROR)
        if code == ExitStatus.INTERRUPTED:  # Typer turns KeyboardInterrupt into a silent Exit(130)
            print("dsctl: interrupted", file=sys.stderr)
        return code
    except DsctlError as exc:
        print(f"dsctl: error: {exc}", file=sys.stderr)
        return int(exc.exit_status)
    except KeyboardInterrupt:
        print("dsctl: interrupted", file=sys.stderr)
        return int(ExitStatus.INTERRUPTED)
    except Exception as exc:  # the last-resort handler: a bug, not a user error
        if os.environ.get("DSCTL_DEBUG"):
            raise
        print(f"dsctl: internal error: {type(exc).__name__}: {exc} (set DSCTL_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return int(ExitStatus.ERROR)
    return int(ExitStatus.OK)
