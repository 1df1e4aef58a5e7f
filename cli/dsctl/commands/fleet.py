"""`dsctl provision` and `dsctl check`: run the provisioning or audit playbook and report per host."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dsctl import ui
from dsctl.adapters import inventory as inventory_adapter
from dsctl.adapters.ansible_run import PlaybookRun, run_playbook
from dsctl.core.fleet import inventory_schema
from dsctl.errors import ExitStatus
from dsctl.ui_progress import PlaybookProgress

InventoryArg = Annotated[Path, typer.Argument(help="Ansible inventory (YAML); its npu_nodes group is the fleet.")]
LimitOption = Annotated[str | None, typer.Option("--limit", help="Only these hosts or groups (Ansible pattern).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON result object.")]
REPORT_FACT = "ascend_validate_report"
LOG_LINES_SHOWN = 10


def _validate_inventory(inventory: Path, hostvars: dict | None = None) -> dict[str, inventory_schema.HostSettings]:
    """Schema and matrix check of every host before any play runs (one-line error, exit 2 or 3)."""
    return inventory_schema.validate_fleet(inventory_adapter.host_vars(inventory) if hostvars is None else hostvars)


def _versions(report: dict[str, Any]) -> dict[str, str]:
    versions = report.get("versions", {})
    driver, firmware, cann = versions.get("driver", {}), versions.get("firmware", {}), versions.get("cann", {})

    def installed_running(item: dict[str, Any]) -> str:
        installed, running = item.get("installed"), item.get("running")
        if installed and running and installed != running:
            return f"{installed} (running {running})"
        return installed or running or "-"

    return {
        "driver": installed_running(driver),
        "firmware": installed_running(firmware),
        "cann": cann.get("active") or "-",
        "cann_others": ", ".join(v for v in cann.get("installed", []) if v != cann.get("active")),
        "torch_npu": versions.get("torch_npu") or "-",
        "vllm_ascend": versions.get("vllm_ascend") or "-",
    }


def _failure_lines(run: PlaybookRun) -> list[str]:
    lines = []
    for name, host in sorted(run.hosts.items()):
        if host.status == "failed":
            lines.append(f"{name}: failed at {host.failed_label}: {host.failed_msg}")
            lines += [f"    {line}" for line in (host.stdout_tail or host.stderr_tail)[-LOG_LINES_SHOWN:]]
        elif host.status == "unreachable":
            lines.append(f"{name}: unreachable: {host.failed_msg}")
    return lines


def _hosts_to_rerun(run: PlaybookRun) -> list[str]:
    return sorted(run.hosts_with("failed") + run.hosts_with("unreachable"))


def _rerun_hint(run: PlaybookRun, command: str, inventory: Path) -> str | None:
    redo = _hosts_to_rerun(run)
    if not redo:
        return None
    return f"re-run these hosts once fixed: dsctl {command} {inventory} --limit {','.join(redo)}"


def _print_run_tail(run: PlaybookRun, errors: list[str], command: str, inventory: Path) -> None:
    """Failures with their log lines, which hosts to re-run, and where the run's log is (stderr)."""
    console = ui.stderr_console()
    for line in errors:
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    hint = _rerun_hint(run, command, inventory)
    if hint:
        console.print(hint, markup=False, soft_wrap=True)
    console.print(f"run log: {run.log}", markup=False, style="dim", soft_wrap=True)


def provision(
    inventory: InventoryArg,
    limit: LimitOption = None,
    check: Annotated[bool, typer.Option("--check", help="Report what would change; change nothing.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Show file differences.")] = False,
    tags: Annotated[str | None, typer.Option("--tags", help="Only tasks with these Ansible tags.")] = None,
    forks: Annotated[int | None, typer.Option("--forks", min=1, help="Hosts worked on in parallel.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Install driver, firmware, CANN, the NPU environment and the serving stack; validate every host."""
    settings = _validate_inventory(inventory)
    with PlaybookProgress() as progress:
        run = run_playbook("provision.yml", inventory, limit=limit, check=check, diff=diff, tags=tags, forks=forks,
                           on_event=progress)
    rows = []
    for name in sorted(run.hosts):
        host = run.hosts[name]
        report = host.facts.get(REPORT_FACT, {})
        status = host.status
        if status in ("ok", "changed") and report.get("status") == "pending-reboot":
            status = "pending-reboot"
        rows.append({"host": name, **_versions(report), "changed": host.changed, "status": status,
                     "stack": settings[name].stack.to_dict() if name in settings and settings[name].stack else None})
    code = run.exit_status()
    errors = _failure_lines(run)
    if as_json:
        ui.emit_json(["provision"], {"hosts": rows, "rerun": _hosts_to_rerun(run), "artifacts": str(run.artifacts),
                                     "check_mode": check},
                     exit_code=int(code), errors=errors)
        raise typer.Exit(int(code))
    ui.print_table(
        f"dsctl provision{' --check' if check else ''}: {len(rows)} hosts",
        ["host", "driver", "firmware", "CANN", "torch_npu", "vllm-ascend", "changed", "status"],
        [[r["host"], r["driver"], r["firmware"], r["cann"], r["torch_npu"], r["vllm_ascend"], r["changed"],
          r["status"]] for r in rows],
    )
    _print_run_tail(run, errors, "provision", inventory)
    raise typer.Exit(int(code))


def check(inventory: InventoryArg, limit: LimitOption = None, as_json: JsonOption = False) -> None:
    """Read-only audit of every host: versions, NPUs, pending reboot, env drift, incompatibilities with fixes."""
    _validate_inventory(inventory)
    # --check as well: the audit play only reads, and Ansible's check mode makes that a guarantee.
    with PlaybookProgress() as progress:
        run = run_playbook("check.yml", inventory, limit=limit, check=True, on_event=progress)
    rows, errors = [], _failure_lines(run)
    for name in sorted(run.hosts):
        host = run.hosts[name]
        report = host.facts.get(REPORT_FACT)
        if host.status == "unreachable" or report is None:
            rows.append({"host": name, "status": host.status if host.status != "ok" else "error",
                         "findings": [], "versions": {}, "npus": {}})
            continue
        rows.append({"host": name, **report})
    statuses = [row["status"] for row in rows]
    if any(s in ("unreachable",) for s in statuses) and not any(s in ("error", "failed") for s in statuses):
        code = ExitStatus.HOSTS_UNREACHABLE
    elif any(s in ("error", "failed", "pending-reboot", "unreachable") for s in statuses):
        code = ExitStatus.VALIDATION_FAILED
    else:
        code = ExitStatus.OK
    if as_json:
        ui.emit_json(["check"], {"hosts": rows, "artifacts": str(run.artifacts)}, exit_code=int(code), errors=errors)
        raise typer.Exit(int(code))
    table_rows = []
    for row in rows:
        versions = _versions(row)
        npus = row.get("npus", {})
        chips = "/".join(npus.get("chips", []) or []) or "-"
        unhealthy = ", ".join(f"NPU {u['npu']} {u['health']}" for u in npus.get("unhealthy", [])) or "all OK"
        hbm = f"{npus.get('hbm_used_mb', 0)}/{npus.get('hbm_total_mb', 0)}" if npus else "-"
        table_rows.append([row["host"], row["status"], versions["driver"], versions["firmware"],
                           versions["cann"] + (f" (+{versions['cann_others']})" if versions["cann_others"] else ""),
                           versions["torch_npu"], versions["vllm_ascend"],
                           f"{npus.get('count', '-')} x {chips}" if npus else "-", unhealthy if npus else "-", hbm])
    ui.print_table(f"dsctl check: {len(rows)} hosts",
                   ["host", "status", "driver", "firmware", "CANN", "torch_npu", "vllm-ascend", "NPUs", "health",
                    "HBM MB"], table_rows)
    out = ui.stdout_console()
    for row in rows:
        for finding in row.get("findings", []):
            if finding["severity"] == "info":
                continue
            out.print(f"{row['host']}: {finding['severity']}: {finding['sentence']} Fix: {finding['fix']}",
                      markup=False, soft_wrap=True)
    console = ui.stderr_console()
    for line in errors:
        console.print(line, markup=False, soft_wrap=True)
    raise typer.Exit(int(code))


DEPLOY_REPORT_FACT = "inference_service_report"


def _render_preview(settings: dict[str, inventory_schema.HostSettings], limit_hosts: set[str] | None) -> list[dict]:
    """What deploy would write on each host, secrets masked: rendered locally, no host contacted."""
    from dsctl.core.serving import service, service_render

    preview = []
    for host, host_settings in settings.items():
        if limit_hosts is not None and host not in limit_hosts:
            continue
        rendered = service_render.render_host(
            host_settings.services, npu_count=host_settings.dsctl_npu_count, env=host_settings.environment,
            config_dir=host_settings.dsctl_service_config_dir, log_dir=host_settings.dsctl_service_log_dir,
            install_path=host_settings.dsctl_install_path)
        for planned in service.plan_host(host_settings.services, host_settings.dsctl_npu_count):
            for item in rendered[planned.name]:
                preview.append({"host": host, "instance": planned.name, "path": item.path, "mode": f"0{item.mode:o}",
                                "content": "(holds the API key; not shown)" if item.secret else item.content})
    return preview


def deploy(
    inventory: InventoryArg,
    limit: LimitOption = None,
    check: Annotated[bool, typer.Option("--check", help="Report what would change; change nothing.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Show file differences.")] = False,
    serial: Annotated[int | None, typer.Option("--serial", min=1, help="Hosts deployed at a time.")] = None,
    render: Annotated[bool, typer.Option("--render", help="Print the files deploy would write; touch no host.")]
    = False,
    as_json: JsonOption = False,
    vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file",
                                                             help="File with the ansible-vault password.")] = None,
) -> None:
    """Render and (re)start the inference instances of dsctl_services, health-gated, rolling back on failure."""
    vault = inventory_adapter.VaultOptions(password_file=vault_password_file)
    hostvars = inventory_adapter.host_vars(inventory, vault=vault)  # read once: settings here, endpoints below
    settings = _validate_inventory(inventory, hostvars)
    if render:
        hosts = set(limit.split(",")) if limit else None
        preview = _render_preview(settings, hosts)
        if as_json:
            ui.emit_json(["deploy", "--render"], preview)
            return
        out = ui.stdout_console()
        for item in preview:
            out.print(f"# {item['host']}: {item['path']} (mode {item['mode']})", markup=False, style="bold")
            out.print(item["content"], markup=False, highlight=False, soft_wrap=True)
        return
    extra = {"dsctl_deploy_serial": serial} if serial else None
    with PlaybookProgress() as progress:
        run = run_playbook("deploy.yml", inventory, limit=limit, check=check, diff=diff, on_event=progress,
                           extra_vars=extra, vault=vault)
    from dsctl.core.serving import service

    addresses = {host: str(values.get("ansible_host", host)) for host, values in hostvars.items()}
    rows = []
    for name in sorted(run.hosts):
        host = run.hosts[name]
        host_settings = settings.get(name)
        if host_settings is None:
            continue
        outcomes = host.facts.get(DEPLOY_REPORT_FACT, {})
        for planned in service.plan_host(host_settings.services, host_settings.dsctl_npu_count):
            spec = next(s for s in host_settings.services if s.name == planned.service)
            status = outcomes.get(planned.name) or ("unreachable" if host.status == "unreachable" else
                                                    "checked" if check else "not reached")
            address = addresses.get(name, name)
            rows.append({"host": name, "instance": planned.name, "engine": spec.engine,
                         "npus": planned.visible_devices, "port": planned.port, "status": status,
                         "endpoint": f"http://{address}:{planned.port}/v1"})
    code = run.exit_status()
    errors = _failure_lines(run)
    if as_json:
        ui.emit_json(["deploy"], {"instances": rows, "rerun": _hosts_to_rerun(run), "artifacts": str(run.artifacts),
                                  "check_mode": check},
                     exit_code=int(code), errors=errors)
        raise typer.Exit(int(code))
    ui.print_table(f"dsctl deploy{' --check' if check else ''}: {len(rows)} instances",
                   ["host", "instance", "engine", "NPUs", "port", "status", "endpoint"],
                   [[r["host"], r["instance"], r["engine"], r["npus"], r["port"], r["status"], r["endpoint"]]
                    for r in rows])
    _print_run_tail(run, errors, "deploy", inventory)
    raise typer.Exit(int(code))

