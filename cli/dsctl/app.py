"""The dsctl command: registers the verbs; main() is the one place errors become exit codes."""

from __future__ import annotations

import importlib
import os
import re
import signal
import sys
from typing import Annotated

import typer
import typer.main

# Typer >= 0.24 vendors Click; its exception classes are what the parser raises.
from typer import _click as click
from typer._click import exceptions as click_errors
from typer.core import TyperGroup

from dsctl import __version__
from dsctl.errors import DsctlError, ExitStatus
from dsctl.services.context import AppContext

# The verbs, in the order `dsctl --help` lists them: name -> (module under dsctl.commands, its command function, or
# None for a module whose `app` is a group of subcommands).  A module is imported only when its verb runs (or help
# lists it): importing every verb up front (optuna, numpy, paramiko, the pydantic schemas) took 0.9 s of each
# `dsctl` call, about 0.2 s without them.
VERBS: dict[str, tuple[str, str | None]] = {
    "lab": ("lab", None), "engine": ("engine", None), "wheelhouse": ("wheelhouse", None),
    "matrix": ("matrix", "show"), "provision": ("provision", "run"), "check": ("check", "run"),
    "deploy": ("deploy", "run"), "probe": ("probe", "run"), "estimate": ("estimate", "show"), "tune": ("tune", "run"),
    "upgrade": ("upgrade", "run"),
}


def load_verb(name: str) -> click.Command:
    module_name, function = VERBS[name]
    module = importlib.import_module(f"dsctl.commands.{module_name}")
    if function is None:
        group = typer.main.get_group(module.app)
        group.name = name
        return group
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    single.command(name=name)(getattr(module, function))
    return typer.main.get_command(single)


class LazyVerbs(TyperGroup):
    """The root group: each verb's command is built from its module the first time it is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*dict.fromkeys([*VERBS, *super().list_commands(ctx)])]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in VERBS:
            self.commands[cmd_name] = load_verb(cmd_name)
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    name="dsctl",
    help="Take Ascend 910B servers from bare OS to a tuned DeepSeek inference service.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=LazyVerbs,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"dsctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """dsctl: provision, deploy, tune and upgrade Ascend NPU inference fleets."""
    if not isinstance(ctx.obj, AppContext):
        ctx.obj = AppContext()


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


_TYPE_WORDS = {"int": "integer", "float": "float", "bool": "boolean"}
_OPTION_PREFIX = re.compile(r"^Option '[^']*' ")


def _param_name(param) -> str:
    if getattr(param, "param_type_name", "") == "argument":
        return str(getattr(param, "metavar", None) or param.name).upper()
    opts = [opt for opt in param.opts if opt.startswith("--")] or list(param.opts)
    return max(opts, key=len)


def _bad_value(exc: click_errors.BadParameter) -> str:
    """Typer checks values with pydantic: its first error, said the way Click says it."""
    cause = exc.__cause__
    errors = cause.errors() if hasattr(cause, "errors") else []
    if not errors:
        return exc.message.rstrip(".")
    error = errors[0]
    value, kind = error.get("input"), str(error.get("type", ""))
    if kind.endswith("_parsing") and kind.removesuffix("_parsing") in _TYPE_WORDS:
        return f"{value!r} is not a valid {_TYPE_WORDS[kind.removesuffix('_parsing')]}"
    if kind == "value_error" and error.get("ctx", {}).get("error") is not None:
        return str(error["ctx"]["error"]).rstrip(".")
    return f"{value!r} " + str(error.get("msg", "is not valid")).replace("Input should be", "should be", 1)


def usage_line(exc: click_errors.UsageError) -> str:
    """A Click usage error as dsctl's one line: ``<option>: <problem>``."""
    if isinstance(exc, click_errors.MissingParameter) and exc.param is not None:
        kind = "argument" if exc.param.param_type_name == "argument" else "option"
        return f"{_param_name(exc.param)}: required {kind} is missing"
    if isinstance(exc, click_errors.BadParameter) and exc.param is not None:
        return f"{_param_name(exc.param)}: {_bad_value(exc)}"
    if isinstance(exc, click_errors.NoSuchOption):
        hint = f"; did you mean {' or '.join(sorted(exc.possibilities))}?" if exc.possibilities else ""
        return f"{exc.option_name}: no such option{hint}"
    if isinstance(exc, click_errors.BadOptionUsage):
        return f"{exc.option_name}: {_OPTION_PREFIX.sub('', exc.message).rstrip('.')}"
    message = exc.format_message().rstrip(".")
    return message[:1].lower() + message[1:]


def main(argv: list[str] | None = None, *, context: AppContext | None = None) -> int:
    """Run dsctl; usage errors exit 2 and DsctlError exits with its status, each after one stderr line.

    ``context`` replaces the default ports (the real ansible-playbook runner and HTTP prober)."""
    # A kill or a CI timeout stops dsctl the way Ctrl-C does, so a running playbook is stopped with it.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = app(args=argv, prog_name="dsctl", standalone_mode=False, obj=context)
    except click_errors.NoArgsIsHelpError:  # the help was printed already
        return int(ExitStatus.USAGE)
    except click_errors.UsageError as exc:
        print(f"dsctl: error: {usage_line(exc)}", file=sys.stderr)
        return int(ExitStatus.USAGE)
    except click_errors.ClickException as exc:
        print(f"dsctl: error: {exc.format_message()}", file=sys.stderr)
        return int(exc.exit_code)
    except SystemExit as exc:  # a command that exits itself (engine serve: argparse)
        return exc.code if isinstance(exc.code, int) else int(ExitStatus.OK if exc.code is None else ExitStatus.ERROR)
    except (typer.Abort, EOFError):
        print("dsctl: interrupted", file=sys.stderr)
        return int(ExitStatus.INTERRUPTED)
    except DsctlError as exc:
        prefix = "interrupted" if exc.exit_status == ExitStatus.INTERRUPTED else "error"
        print(f"dsctl: {prefix}: {exc}", file=sys.stderr)
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
    # Not standalone: a command's typer.Exit(code) and --help come back as the code, a normal return as None.
    code = int(code) if isinstance(code, int) else int(ExitStatus.OK)
    if code == ExitStatus.INTERRUPTED:  # Typer turns KeyboardInterrupt into a silent Exit(130)
        print("dsctl: interrupted", file=sys.stderr)
    return code
