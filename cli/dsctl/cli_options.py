"""What the commands share: Typer option types and number callbacks, the application context, and the
run-a-playbook-verb-then-report sequence of provision, check and deploy."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn, Protocol, TypeVar

import typer

from dsctl import ui
from dsctl.services.context import AppContext
from dsctl.services.inputs import Bound
from dsctl.services.ports import PlaybookRunner, ProgressSink
from dsctl.ui_progress import playbook_progress

InventoryArg = Annotated[Path, typer.Argument(help="Ansible inventory (YAML); its npu_nodes group is the fleet.")]


def _limit_pattern(value: str | None) -> str | None:
    """An empty --limit would select every host: Ansible ignores an empty pattern, so ``--limit ""`` (an unset
    shell variable) rendered or changed the whole fleet.  A pattern of separators only (``,``, ``:``) is as empty
    (https://docs.ansible.com/ansible/latest/inventory_guide/intro_patterns.html)."""
    if value is not None and not value.replace(",", " ").replace(":", " ").strip():
        raise typer.BadParameter(f"{value!r} names no host or group; give host names, groups or a pattern such as "
                                 "'atlas-a0*', or leave --limit out for every host")
    return value


LimitOption = Annotated[str | None, typer.Option("--limit", callback=_limit_pattern,
                                                 help="Only these hosts or groups (Ansible pattern).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON result object.")]
CheckOption = Annotated[bool, typer.Option("--check", help="Report what would change; change nothing.")]
DiffOption = Annotated[bool, typer.Option("--diff", help="Show file differences.")]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Show every task as it runs, not one row per "
                                                                     "host and stage.")]
VaultFileOption = Annotated[Path | None, typer.Option(
    "--vault-password-file", help="File with the Ansible Vault password (or a script printing it); "
                                  "ANSIBLE_VAULT_PASSWORD_FILE works too.")]
AskVaultOption = Annotated[bool, typer.Option("--ask-vault-pass", help="Prompt once for the Ansible Vault password.")]

Number = TypeVar("Number", int, float)


def bounded(bound: Bound) -> Callable[[typer.CallbackParam, Number | None], Number | None]:
    """A Typer option callback: ``bound`` (`dsctl.services.inputs.Bound`: finite, within its range) applied while
    the command line is parsed, before the command runs; every int and float option takes one."""
    def check(param: typer.CallbackParam, value: Number | None) -> Number | None:
        if value is None:
            return value
        bound.check(max((opt for opt in param.opts if opt.startswith("--")), key=len, default=str(param.name)), value)
        return value
    return check


Inputs = TypeVar("Inputs")
Result = TypeVar("Result", bound="VerbResult")


class VerbResult(Protocol):
    """What a playbook verb returns, as far as reporting it goes."""

    @property
    def exit_status(self) -> int: ...

    @property
    def errors(self) -> Sequence[str]: ...

    def to_dict(self) -> Mapping[str, Any]: ...


def app_context(ctx: typer.Context) -> AppContext:
    """The context `dsctl.app` put on ``ctx.obj`` (tests hand their own to CliRunner.invoke(obj=...))."""
    root = ctx.find_root()
    if not isinstance(root.obj, AppContext):
        root.obj = AppContext()
    return root.obj


def run_playbook_verb(ctx: typer.Context, verb: Callable[[PlaybookRunner, Inputs, ProgressSink], Result],
                      inputs: Inputs, *, verbose: bool) -> Result:
    """Run ``verb`` with the context's runner, its playbook's progress on stderr (per host and stage, or every
    task with ``--verbose``)."""
    with playbook_progress(verbose=verbose) as progress:
        return verb(app_context(ctx).runner, inputs, progress)


def report(command: str, result: VerbResult, *, as_json: bool, render: Callable[[], None]) -> NoReturn:
    """One --json envelope or ``render()``'s tables, then exit with the verb's status."""
    code = int(result.exit_status)
    if as_json:
        ui.emit_json([command], result.to_dict(), exit_code=code, errors=result.errors)
    else:
        render()
    raise typer.Exit(code)
