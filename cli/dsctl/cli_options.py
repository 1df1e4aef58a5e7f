"""What the commands share: Typer option types, the application context, vault and --param parsing."""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from dsctl.adapters import ansible_run
from dsctl.adapters.inventory import VaultOptions
from dsctl.errors import UsageError
from dsctl.services.context import AppContext

InventoryArg = Annotated[Path, typer.Argument(help="Ansible inventory (YAML); its npu_nodes group is the fleet.")]
LimitOption = Annotated[str | None, typer.Option("--limit", help="Only these hosts or groups (Ansible pattern).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON result object.")]
CheckOption = Annotated[bool, typer.Option("--check", help="Report what would change; change nothing.")]
DiffOption = Annotated[bool, typer.Option("--diff", help="Show file differences.")]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Show every task as it runs, not one row per "
                                                                     "host and stage.")]
VaultFileOption = Annotated[Path | None, typer.Option(
    "--vault-password-file", help="File with the Ansible Vault password (or a script printing it); "
                                  "ANSIBLE_VAULT_PASSWORD_FILE works too.")]
AskVaultOption = Annotated[bool, typer.Option("--ask-vault-pass", help="Prompt once for the Ansible Vault password.")]

VAULT_FILE_NAME = "vault-pass"


def app_context(ctx: typer.Context) -> AppContext:
    """The context `dsctl.app` put on ``ctx.obj`` (tests hand their own to CliRunner.invoke(obj=...))."""
    root = ctx.find_root()
    if not isinstance(root.obj, AppContext):
        root.obj = AppContext()
    return root.obj


@contextmanager
def vault_options(password_file: Path | None, ask: bool, playbook: str
                  ) -> Iterator[tuple[VaultOptions | None, Path | None]]:
    """(how Ansible gets the vault password, the run's artifacts directory or None for a new one).

    ``--ask-vault-pass`` prompts once here (ansible-playbook has no terminal): the password goes to a 0600 file in
    the run's own 0700 artifacts directory for ansible-inventory and ansible-playbook, and is deleted afterwards.
    """
    if password_file is not None and ask:
        raise UsageError("--ask-vault-pass: give it or --vault-password-file, not both")
    if password_file is not None:
        if not password_file.is_file():
            raise UsageError(f"--vault-password-file: {password_file} is not a file")
        yield VaultOptions(password_file=password_file.absolute()), None
        return
    if not ask:
        yield None, None
        return
    password = getpass.getpass("Vault password: ")
    if not password:
        raise UsageError("--ask-vault-pass: the password is empty")
    artifacts = ansible_run.new_artifacts_dir(playbook)
    secret = artifacts / VAULT_FILE_NAME
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(password + "\n")
        yield VaultOptions(password_file=secret), artifacts
    finally:
        secret.unlink(missing_ok=True)


def _param_value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text.strip() else text
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
