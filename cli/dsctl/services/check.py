"""The check verb: a read-only audit of every host (versions, NPUs, pending reboot, env drift, the NPU parameter
plane, fixes)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl.adapters.ansible_run import PlaybookRun
from dsctl.adapters.inventory import VaultOptions
from dsctl.core.fleet import audit
from dsctl.core.inventory import host_plan
from dsctl.core.network import hccn_state, npu_check
from dsctl.core.network.npu_check import InstanceUse, PeerPing
from dsctl.errors import ExitStatus
from dsctl.services.fleet import Fleet, check_playbook_options, load_fleet
from dsctl.services.ports import PlaybookRunner, ProgressSink, no_progress
from dsctl.services.runs import REPORT_FACT, failure_lines

PLAYBOOK = "check.yml"


@dataclass(frozen=True)
class CheckInputs:
    inventory: Path
    limit: str | None = None
    vault: VaultOptions | None = None
    artifacts_dir: Path | None = None

    def __post_init__(self) -> None:
        check_playbook_options(vault=self.vault)


@dataclass(frozen=True)
class CheckResult:
    # Per host: {"host": name, **the ascend_validate report} (status, versions, npus, findings, ...).
    hosts: tuple[dict[str, Any], ...]
    exit_status: ExitStatus
    errors: tuple[str, ...]
    run: PlaybookRun = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": [dict(host) for host in self.hosts], "artifacts": str(self.run.artifacts)}


def exit_status_of(statuses: list[str]) -> ExitStatus:
    """5 when the only trouble is unreachable hosts, 3 when any host has an error or waits for a reboot."""
    if "unreachable" in statuses and not any(s in ("error", "failed") for s in statuses):
        return ExitStatus.HOSTS_UNREACHABLE
    if any(s in ("error", "failed", "pending-reboot", "unreachable") for s in statuses):
        return ExitStatus.VALIDATION_FAILED
    return ExitStatus.OK


def env_states(env: list[dict[str, Any]], findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The wanted env entries, each with ``state``: "verified" when the host's env file holds the value, else
    "drift" (the audit's env findings name the variable: changed or missing)."""
    drift = " ".join(f.get("sentence", "") for f in findings if f.get("component") == "env")
    missing_file = any(f.get("code") == "env-missing" for f in findings)
    return [{**entry, "state": "drift" if missing_file or re.search(rf"\b{re.escape(entry['name'])}\b", drift)
             else "verified"} for entry in env]


def _instances_to_inspect(fleet: Fleet) -> dict[str, list[dict[str, Any]]]:
    """Per host, the declared instances whose processes the audit reads (unit and service manager)."""
    from dsctl.core.inventory.deploy_plan import plan_deploy

    plan = plan_deploy(fleet.settings, {host: fleet.address(host) for host in fleet.settings})
    found: dict[str, list[dict[str, Any]]] = {}
    for item in plan.instances:
        found.setdefault(item.host, []).append({
            "name": item.instance.name, "unit": item.instance.unit, "manager": item.spec.manager,
            "runtime": getattr(item.spec, "container_runtime", None)})
    return found


def multi_host_instances(fleet: Fleet) -> list[InstanceUse]:
    """The fleet's instances that span hosts (the host groups validate_fleet planned with dsctl.core.serving.multinode),
    as the NPU network check needs them: which hosts must reach each other's NPUs, and which instance a broken NPU
    or pair stops.  None: the check pairs every host that has an NPU network plan."""
    groups = next((settings.host_groups for settings in fleet.settings.values()), ())
    return [InstanceUse(group.name, group.hosts, group.npus) for group in groups]


def _network_pings(fleet: Fleet, instances: list[InstanceUse]) -> dict[str, list[PeerPing]]:
    plan = fleet.network
    groups = [instance.hosts for instance in instances] or None
    return npu_check.ping_plan(plan, [host for host in fleet.settings if host in plan], groups)


def _network_var(fleet: Fleet, pings: dict[str, list[PeerPing]]) -> dict[str, Any]:
    """Per checked host with a plan: its NPUs and the pings it sends (what playbooks/check.yml hands the collector)."""
    plan = fleet.network
    return {host: {"npus": [npu.npu for npu in plan.host(host).npus],
                   "pings": [ping.to_arg() for ping in pings.get(host, [])]}
            for host in fleet.settings if host in plan}


_RANK = {status: rank for rank, status in enumerate(audit.STATUSES)}


def _with_network(row: dict[str, Any], report: npu_check.NetworkReport) -> dict[str, Any]:
    findings = [finding.to_dict() for finding in report.findings]
    status = row["status"]
    for finding in report.findings:
        worse = {"error": "error", "warning": "warning"}.get(finding.severity)
        if worse is not None and status in _RANK and _RANK[worse] > _RANK[status]:
            status = worse
    return {**row, "status": status, "findings": [*row.get("findings", []), *findings],
            "npu_network": dict(report.summary)}


def _network_rows(fleet: Fleet, run: PlaybookRun, rows: list[dict[str, Any]], pings: dict[str, list[PeerPing]],
                  instances: list[InstanceUse], inventory: str) -> list[dict[str, Any]]:
    """The rows with each planned host's NPU network findings and summary (dsctl.core.network.npu_check), judged
    over every host's answers at once: a ping that failed is put on the NPU that explains it, wherever that is."""
    plan = fleet.network
    states: dict[str, hccn_state.HostNetworkState | None] = {}
    for row in rows:
        outcome = run.hosts.get(row["host"])
        raw = outcome.facts.get("ascend_npu_network") if outcome is not None else None
        if row["host"] in plan:
            states[row["host"]] = hccn_state.parse_network(raw) if isinstance(raw, dict) else None
    if not states:
        return rows
    pending = {row["host"] for row in rows if row.get("pending_reboot")}
    reports = npu_check.network_findings(plan, states, pings, instances=instances, inventory=inventory,
                                         pending_reboot=pending)
    return [_with_network(row, reports[row["host"]]) if row["host"] in reports and row.get("versions") is not None
            and row["status"] != "unreachable" else row for row in rows]


def _chip_rows(rows: list[dict[str, Any]], instances: list[InstanceUse], inventory: str) -> list[dict[str, Any]]:
    """The rows with an error on each host whose chips differ from its multi-host instance's head
    (npu_check.chip_findings, from the chip names the audit read)."""
    chips = {row["host"]: list((row.get("npus") or {}).get("chips") or []) for row in rows}
    found = npu_check.chip_findings(instances, chips, inventory)
    result = []
    for row in rows:
        extra = found.get(row["host"], [])
        if extra:
            status = "error" if row["status"] in _RANK and _RANK["error"] > _RANK[row["status"]] else row["status"]
            row = {**row, "status": status, "findings": [*row.get("findings", []), *(f.to_dict() for f in extra)]}
        result.append(row)
    return result


def check(runner: PlaybookRunner, inputs: CheckInputs, progress: ProgressSink = no_progress, *,
          read: Fleet | None = None) -> CheckResult:
    """``read``: the fleet the calling command read already (dsctl upgrade's preflight), not read again."""
    fleet = load_fleet(inputs.inventory, vault=inputs.vault, limit=inputs.limit, read=read)
    instances = multi_host_instances(fleet)
    pings = _network_pings(fleet, instances)
    # --check as well: the audit play only reads, and Ansible's check mode makes that a guarantee.
    run = runner.run(PLAYBOOK, inputs.inventory, limit=inputs.limit, check=True, vault=inputs.vault,
                     extra_vars={host_plan.PLAN_VAR: fleet.plan(),
                                 host_plan.CHECK_INSTANCES_VAR: _instances_to_inspect(fleet),
                                 host_plan.CHECK_NETWORK_VAR: _network_var(fleet, pings)},
                     on_event=progress, artifacts_dir=inputs.artifacts_dir)
    rows: list[dict[str, Any]] = []
    for name in sorted(run.hosts):
        outcome = run.hosts[name]
        report = outcome.facts.get(REPORT_FACT)
        settings = fleet.settings.get(name)
        env = settings.environment_sources if settings is not None else []
        if outcome.status == "unreachable" or report is None:
            rows.append({"host": name, "status": outcome.status if outcome.status != "ok" else "error",
                         "findings": [], "versions": {}, "npus": {}, "env": env})
            continue
        row = {"host": name, **report, "env": env_states(env, report.get("findings", []))}
        raw = outcome.facts.get("ascend_raw") or {}
        stale = audit.instance_findings(name, str(inputs.inventory), list(raw.get("instances") or []),
                                        ((report.get("versions") or {}).get("cann") or {}).get("active"))
        if stale:
            row["findings"] = [*row.get("findings", []), *(finding.to_dict() for finding in stale)]
            row["status"] = "error"
        rows.append(row)
    rows = _network_rows(fleet, run, rows, pings, instances, str(inputs.inventory))
    rows = _chip_rows(rows, instances, str(inputs.inventory))
    return CheckResult(hosts=tuple(rows), exit_status=exit_status_of([row["status"] for row in rows]),
                       errors=tuple(failure_lines(run)), run=run)
