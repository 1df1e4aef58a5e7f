"""`dsctl deploy`: the inference instances of dsctl_services, health-gated, rolled back on failure."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dsctl import ui
from dsctl.cli_options import (
    AskVaultOption,
    CheckOption,
    DiffOption,
    InventoryArg,
    JsonOption,
    LimitOption,
    VaultFileOption,
    VerboseOption,
    bounded,
    report,
    run_playbook_verb,
)
from dsctl.services.deploy import DeployInputs, DeployResult, RenderResult, deploy, render
from dsctl.services.inputs import HOSTS, parse_params, vault_options

COLUMNS = ["host", "instance", "engine", "NPUs", "port", "status", "endpoint"]


def run(
    ctx: typer.Context,
    inventory: InventoryArg,
    limit: LimitOption = None,
    check: CheckOption = False,
    diff: DiffOption = False,
    serial: Annotated[int | None, typer.Option("--serial", min=1, help="Hosts deployed at a time.",
                                                            callback=bounded(HOSTS))] = None,
    instance: Annotated[list[str] | None, typer.Option(
        "--instance", help="Only this instance (chat-1) or service (chat); repeatable. Default: all.")] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", help="Override an engine parameter: SERVICE.KEY=VALUE (chat.max_num_seqs=64); repeatable.")
    ] = None,
    restart: Annotated[bool, typer.Option("--restart", help="Restart the instances even when nothing changed.")]
    = False,
    render_only: Annotated[bool, typer.Option("--render", help="Print the files deploy would write; touch no host.")]
    = False,
    vault_password_file: VaultFileOption = None,
    ask_vault_pass: AskVaultOption = False,
    verbose: VerboseOption = False,
    as_json: JsonOption = False,
) -> None:
    """Render and (re)start the inference instances of dsctl_services, health-gated, rolling back on failure."""
    inputs = DeployInputs(inventory=inventory, limit=limit, check=check, diff=diff, serial=serial,
                          instances=tuple(instance) if instance else None, overrides=parse_params(param),
                          restart=restart, vault=vault_options(vault_password_file, ask_vault_pass))
    if render_only:
        _print_render(render(inputs), as_json)
        return
    result = run_playbook_verb(ctx, deploy, inputs, verbose=verbose)
    report("deploy", result, as_json=as_json, render=lambda: _render(result, inventory, check))


def _render(result: DeployResult, inventory: Path, check: bool) -> None:
    ui.print_table(f"dsctl deploy{' --check' if check else ''}: {len(result.instances)} instances", COLUMNS,
                   [[r.host, r.instance, r.engine, r.npus, r.port, r.status, r.endpoint] for r in result.instances])
    ui.print_run_tail(result.errors, rerun=result.rerun, command="deploy", inventory=inventory, log=result.run.log)


def _print_render(result: RenderResult, as_json: bool) -> None:
    if as_json:
        ui.emit_json(["deploy", "--render"], result.to_dict())
        return
    out = ui.stdout_console()
    for item in result.files:
        out.print(f"# {item.host}: {item.path} (mode {item.mode})", markup=False, style="bold")
        out.print(item.content, markup=False, highlight=False, soft_wrap=True)
