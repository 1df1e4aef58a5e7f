"""`dsctl provision`: driver, firmware, CANN, the NPU environment and the serving stack on every host."""

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
from dsctl.services.inputs import HOSTS, vault_options
from dsctl.services.provision import ProvisionInputs, ProvisionResult, provision

COLUMNS = ["host", "driver", "firmware", "CANN", "torch_npu", "vllm-ascend", "changed", "status"]


def run(
    ctx: typer.Context,
    inventory: InventoryArg,
    limit: LimitOption = None,
    check: CheckOption = False,
    diff: DiffOption = False,
    tags: Annotated[str | None, typer.Option("--tags", help="Only tasks with these Ansible tags.")] = None,
    forks: Annotated[int | None, typer.Option("--forks", min=1, help="Hosts worked on in parallel.",
                                                           callback=bounded(HOSTS))] = None,
    vault_password_file: VaultFileOption = None,
    ask_vault_pass: AskVaultOption = False,
    verbose: VerboseOption = False,
    as_json: JsonOption = False,
    allow_downgrade: Annotated[bool, typer.Option(
        "--allow-downgrade", help="Move hosts to an older CANN, HDK or vllm-ascend than they run (refused without "
        "it), and restart their instances onto it.")] = False,
) -> None:
    """Install driver, firmware, CANN, the NPU environment and the serving stack; validate every host."""
    inputs = ProvisionInputs(inventory=inventory, limit=limit, check=check, diff=diff, tags=tags, forks=forks,
                             vault=vault_options(vault_password_file, ask_vault_pass),
                             allow_downgrade=allow_downgrade)
    result = run_playbook_verb(ctx, provision, inputs, verbose=verbose)
    report("provision", result, as_json=as_json, render=lambda: _render(result, inventory, check))


def _render(result: ProvisionResult, inventory: Path, check: bool) -> None:
    ui.print_table(f"dsctl provision{' --check' if check else ''}: {len(result.hosts)} hosts", COLUMNS,
                   [[h.host, h.driver, h.firmware, h.cann, h.torch_npu, h.vllm_ascend, h.changed, h.status]
                    for h in result.hosts])
    ui.print_env_sources([(h.host, h.env) for h in result.hosts if h.env])
    for host in result.hosts:
        if host.downgrades:
            ui.progress(f"{host.host}: downgraded {', '.join(host.downgrades)}")
    if result.restarted:
        ui.progress(f"restarted onto the downgraded stack: {', '.join(result.restarted)}")
    ui.print_run_tail(result.errors, rerun=result.rerun, command="provision", inventory=inventory, log=result.run.log)
