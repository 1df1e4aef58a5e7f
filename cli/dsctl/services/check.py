"""The check verb: a read-only audit of every host (versions, NPUs, pending reboot, env drift, fixes)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsctl.adapters.ansible_run import PlaybookRun
from dsctl.adapters.inventory import VaultOptions
from dsctl.core.fleet import audit
from dsctl.errors import ExitStatus
from dsctl.services import host_plan
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
    from dsctl.services.deploy_plan import plan_deploy

    plan = plan_deploy(fleet.settings, {host: fleet.address(host) for host in fleet.settings})
    found: dict[str, list[dict[str, Any]]] = {}
    for item in plan.instances:
        found.setdefault(item.host, []).append({
            "name": item.instance.name, "unit": item.instance.unit, "manager": item.spec.manager,
            "runtime": getattr(item.spec, "container_runtime", None)})
    return found


def check(runner: PlaybookRunner, inputs: CheckInputs, progress: ProgressSink = no_progress) -> CheckResult:
    fleet = load_fleet(inputs.inventory, vault=inputs.vault, limit=inputs.limit)
    # --check as well: the audit play only reads, and Ansible's check mode makes that a guarantee.
    run = runner.run(PLAYBOOK, inputs.inventory, limit=inputs.limit, check=True, vault=inputs.vault,
                     extra_vars={host_plan.PLAN_VAR: fleet.plan(),
                                 host_plan.CHECK_INSTANCES_VAR: _instances_to_inspect(fleet)},
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
    return CheckResult(hosts=tuple(rows), exit_status=exit_status_of([row["status"] for row in rows]),
                       errors=tuple(failure_lines(run)), run=run)
