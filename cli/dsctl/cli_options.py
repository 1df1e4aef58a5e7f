"""What the commands share: Typer option types, the application context, vault and --param parsing, and the
run-a-playbook-verb-then-report sequence of provision, check and deploy."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn, Protocol, TypeVar

import typer
import yaml

from dsctl import ui
from dsctl.adapters.inventory import VaultOptions
from dsctl.core.fleet import yaml_bounds
from dsctl.core.load import limits
from dsctl.errors import UsageError
from dsctl.services.context import AppContext
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


def bounded(low: float | None, high: float | None, what: str, why: str = ""
            ) -> Callable[[typer.CallbackParam, Number | None], Number | None]:
    """A Typer option callback: the one number rule (`dsctl.core.load.limits.number`: finite, within [low, high])
    applied while the command line is parsed, before the command runs; every int and float option takes it."""
    def check(param: typer.CallbackParam, value: Number | None) -> Number | None:
        if value is None:
            return value
        option = max((opt for opt in param.opts if opt.startswith("--")), key=len, default=str(param.name))
        try:
            limits.number(option, value, low, high, what, why)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
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


def vault_options(password_file: Path | None, ask: bool) -> VaultOptions | None:
    """How Ansible gets the vault password, from ``--vault-password-file`` / ``--ask-vault-pass``.

    Nothing is asked here: with ``--ask-vault-pass`` the adapters prompt once, on first use, keep the password in
    the returned object for the rest of the command, and hand it to ansible-playbook as a 0600 file inside the
    run's artifacts directory that is removed after the run (`ansible_run.write_vault_password`).
    """
    if password_file is not None and ask:
        raise UsageError("--ask-vault-pass: give it or --vault-password-file, not both")
    if password_file is not None and not password_file.is_file():
        raise UsageError(f"--vault-password-file: {password_file} is not a file")
    if password_file is None and not ask:
        return None
    return VaultOptions(password_file=password_file.absolute() if password_file is not None else None, ask=ask)


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


def _param_value(text: str) -> Any:
    try:
        return yaml_bounds.safe_load(text, "--param") if text.strip() else text
    except yaml_bounds.TooLarge as exc:
        raise UsageError(str(exc)) from None
    except yaml.YAMLError:
        return text  # not YAML: the plain string, which the parameter's schema then judges


def parse_params(items: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    """``--param SERVICE.KEY=VALUE`` (repeatable) -> {service: {key: value}}; the value is read as YAML (64, 0.9,
    true, {"a": 1}), so it has the type the inventory would give it."""
    overrides: dict[str, dict[str, Any]] = {}
    for item in items or ():
        target, sep, value = item.partition("=")
        service, dot, key = target.partition(".")
        if not sep or not dot or not service or not key:
            raise UsageError(f"--param {item!r}: expected SERVICE.KEY=VALUE, e.g. chat.max_num_seqs=64")
        overrides.setdefault(service, {})[key] = _param_value(value)
    return overrides
