"""`dsctl check`: a read-only audit of every host, one sentence and fix per problem."""

from __future__ import annotations

from typing import Annotated

import typer

from dsctl import ui
from dsctl.cli_options import (
    AskVaultOption,
    InventoryArg,
    JsonOption,
    LimitOption,
    VaultFileOption,
    VerboseOption,
    report,
    run_playbook_verb,
)
from dsctl.services.check import CheckInputs, CheckResult, check
from dsctl.services.check_ready import check_ready
from dsctl.services.inputs import vault_options
from dsctl.services.runs import versions_summary

READY_COLUMNS = ["host", "status", "OS", "arch", "kernel", "RAM GB", "free GB", "serving Python", "NPUs", "blockers"]
COLUMNS = ["host", "status", "driver", "firmware", "CANN", "torch_npu", "vllm-ascend", "NPUs", "health", "HBM MB"]
NETWORK_COLUMNS = ["host", "links UP", "net health Success", "addresses as planned", "hccn.conf as planned",
                   "NPU pairs reachable"]


def run(
    ctx: typer.Context,
    inventory: InventoryArg,
    limit: LimitOption = None,
    vault_password_file: VaultFileOption = None,
    ask_vault_pass: AskVaultOption = False,
    verbose: VerboseOption = False,
    as_json: JsonOption = False,
    ready: Annotated[bool, typer.Option(
        "--ready", help="List what would block provision on each host (OS, Python, arch, kernel, RAM, disk, "
                        "packages, NPUs); needs no Python on the hosts")] = False,
) -> None:
    """Read-only audit of every host: versions, NPUs, pending reboot, env drift, incompatibilities with fixes."""
    if ready:
        ready_inputs = CheckInputs(inventory=inventory, limit=limit,
                                   vault=vault_options(vault_password_file, ask_vault_pass))
        ready_result = run_playbook_verb(ctx, check_ready, ready_inputs, verbose=verbose)
        report("check", ready_result, as_json=as_json, render=lambda: _render_ready(ready_result))
    inputs = CheckInputs(inventory=inventory, limit=limit, vault=vault_options(vault_password_file, ask_vault_pass))
    result = run_playbook_verb(ctx, check, inputs, verbose=verbose)
    report("check", result, as_json=as_json, render=lambda: _render(result))


def _render(result: CheckResult) -> None:
    table_rows = []
    for row in result.hosts:
        versions = versions_summary(row)
        npus = row.get("npus", {})
        chips = "/".join(npus.get("chips", []) or []) or "-"
        unhealthy = ", ".join(f"NPU {u['npu']} {u['health']}" for u in npus.get("unhealthy", [])) or "all OK"
        hbm = f"{npus.get('hbm_used_mb', 0)}/{npus.get('hbm_total_mb', 0)}" if npus else "-"
        table_rows.append([row["host"], row["status"], versions["driver"], versions["firmware"],
                           versions["cann"] + (f" (+{versions['cann_others']})" if versions["cann_others"] else ""),
                           versions["torch_npu"], versions["vllm_ascend"],
                           f"{npus.get('count', '-')} x {chips}" if npus else "-", unhealthy if npus else "-", hbm])
    ui.print_table(f"dsctl check: {len(result.hosts)} hosts", COLUMNS, table_rows)
    _render_network(result)
    reports = [row for row in result.hosts if row.get("env") and row.get("versions")]
    ui.print_env_sources([(row["host"], [{k: v for k, v in e.items() if k != "state"} for e in row["env"]])
                          for row in reports],
                         states={row["host"]: {e["name"]: e.get("state", "") for e in row["env"]} for row in reports})
    out = ui.stdout_console()
    for row in result.hosts:
        for finding in row.get("findings", []):
            if finding["severity"] == "info":
                continue
            out.print(f"{row['host']}: {finding['severity']}: {finding['sentence']} Fix: {finding['fix']}",
                      markup=False, soft_wrap=True)
    console = ui.stderr_console()
    for line in result.errors:
        console.print(line, markup=False, soft_wrap=True)


def _render_network(result: CheckResult) -> None:
    """The NPU parameter plane per host with a plan: counts out of the planned NPUs, and the pings it took part in."""
    rows = []
    for row in result.hosts:
        plane = row.get("npu_network")
        if not plane:
            continue
        if not plane.get("read"):
            rows.append([row["host"], "-", "-", "-", "-", "-"])
            continue
        planned = plane["planned"]
        pairs = f"{plane['pairs_reachable']}/{plane['pairs']}" if plane["pairs"] else "-"
        rows.append([row["host"], f"{plane['links_up']}/{planned}", f"{plane['healthy']}/{planned}",
                     f"{plane['addresses_match']}/{planned}", f"{plane['conf_matches']}/{planned}", pairs])
    if rows:
        ui.print_table("NPU parameter plane (hccn_tool)", NETWORK_COLUMNS, rows)


def _gb(mb: object) -> str:
    return f"{int(mb) / 1024:.0f}" if isinstance(mb, int) else "-"


def _render_ready(result: CheckResult) -> None:
    rows = []
    for row in result.hosts:
        system, python, npus = row.get("system") or {}, row.get("python") or {}, row.get("npus") or {}
        os_text = " ".join(str(p) for p in (system.get("os_id"), system.get("os_version")) if p) or "-"
        npu_text = (f"{npus.get('count', 0)}" + (f" ({len(npus['unhealthy'])} not OK)" if npus.get("unhealthy") else "")
                    if npus.get("present") else "no npu-smi")
        rows.append([row["host"], row["status"], os_text, system.get("arch") or "-", system.get("kernel") or "-",
                     _gb(system.get("mem_total_mb")), _gb(system.get("disk_free_mb")),
                     f"{python.get('path') or '-'} {python.get('version') or '?'}", npu_text if npus else "-",
                     str(len(row.get("blockers") or []))])
    ui.print_table(f"dsctl check --ready: {len(result.hosts)} hosts", READY_COLUMNS, rows)
    out = ui.stdout_console()
    for row in result.hosts:
        for blocker in row.get("blockers") or []:
            out.print(f"{row['host']}: blocks provision: {blocker['sentence']} Fix: {blocker['fix']}",
                      markup=False, soft_wrap=True)
    console = ui.stderr_console()
    for line in result.errors:
        console.print(line, markup=False, soft_wrap=True)
